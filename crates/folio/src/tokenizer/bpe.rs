//! Byte-level BPE (GPT-2 style): words become bytes, bytes become printable characters,
//! and the merges from the GGUF file join adjacent symbols lowest rank first.

use std::collections::HashMap;

/// GPT-2's reversible map from bytes to printable characters.
pub fn byte_to_char() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        map[b as usize] = if printable {
            b as char
        } else {
            n += 1;
            char::from_u32(255 + n).expect("valid code point")
        };
    }
    map
}

/// The merge table: (left id, right id) -> (rank, merged id).
pub struct Merges {
    table: HashMap<(u32, u32), (u32, u32)>,
}

impl Merges {
    pub fn new(table: HashMap<(u32, u32), (u32, u32)>) -> Self {
        Self { table }
    }

    /// Merges `symbols` in place until no adjacent pair has a rank.
    pub fn apply(&self, symbols: &mut Vec<u32>) {
        loop {
            let best = symbols
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| {
                    self.table
                        .get(&(w[0], w[1]))
                        .map(|&(rank, id)| (rank, i, id))
                })
                .min();
            let Some((_, i, id)) = best else { return };
            symbols[i] = id;
            symbols.remove(i + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        let m = byte_to_char();
        let mut seen: Vec<char> = m.to_vec();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 256);
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
    }
}
