//! Pre-tokenizers: how text is split into words before BPE, keyed by the GGUF
//! `tokenizer.ggml.pre` name. Each is a list of regexes applied in turn, as llama.cpp
//! does: every regex splits each piece left by the previous one into its matches and the
//! text between them, so a later regex never sees across an earlier split.
//!
//! The regexes are llama.cpp's, which end in `\s+(?!\S)`: a lookahead, which linear-time
//! engines lack. A backtracking engine (fancy-regex, which folio used before) is not an
//! option: its stack and backtrack limits (10^6) are hit by a run of about a million
//! letters, and an error in the middle of `find_iter` repeats forever. So each regex
//! runs on regex-automata (leftmost-first, the same preference order as backtracking,
//! linear time) with the lookahead alternative replaced by a captured `(\s+)`, and the
//! lookahead is applied to that group's matches by hand:
//!
//! - `\s+(?!\S)` at `p`: the whitespace run `p..q` is maximal, so `q` is the end of the
//!   text (match `p..q`) or a non-space; then the backtracking engine gives back the
//!   last character (match `p..q-1`) if two or more remain, and otherwise fails at `p`
//!   and tries from the next character.
//! - `\s+(?!\S)|\s+` (llama3, qwen2): the same, but a single character is matched by the
//!   plain `\s+`.
//!
//! Every earlier alternative is tried first in both engines, so the splits are identical
//! (the tests compare them with fancy-regex on random text). Each search resumes where
//! the last match ended, and no alternative here looks past the end of the run of
//! letters, digits, symbols or whitespace it stands in, so a split is linear in the
//! text (the tokenizer's tests time 1 MiB runs of each kind).
//!
//! Letters, numbers and punctuation (`\p{L}`, `\p{N}`, `\p{P}`) are those of one
//! Unicode version, spelled out from `unicode_classes.rs` (15.1, llama.cpp's: its
//! tables come from that version), not the regex crate's own, which follow each release of Unicode: a
//! character assigned later (U+1366C, a letter since 16.0) would otherwise be a letter
//! to folio and an unassigned symbol to llama.cpp, split differently, and tokenize
//! differently. `\s` is Unicode's White_Space, unchanged for many versions.

use super::unicode_classes::{LETTER, NUMBER, PUNCTUATION};
use crate::error::TokenizerError;
use regex_automata::meta::Regex;
use regex_automata::util::captures::Captures;
use regex_automata::Input;

/// How a pattern's last alternative treats trailing whitespace.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Tail {
    /// No whitespace tail.
    None,
    /// `\s+(?!\S)`.
    Lookahead,
    /// `\s+(?!\S)|\s+`.
    LookaheadOrOne,
}

/// A llama.cpp pre-tokenizer regex: the alternatives before the tail, and the tail.
#[derive(Clone, Copy)]
struct Pattern {
    head: &'static str,
    tail: Tail,
    /// The head as llama.cpp writes it, where it differs (lookarounds that `head`
    /// spells as class intersections): the tests' reference.
    #[cfg_attr(not(test), allow(dead_code))]
    lookaround_head: Option<&'static str>,
}

impl Pattern {
    /// The regex as llama.cpp writes it (with the lookahead), classes pinned.
    #[cfg(test)]
    fn llama_cpp_form(&self) -> String {
        let head = self.lookaround_head.unwrap_or(self.head);
        pinned(&match self.tail {
            Tail::None => head.to_string(),
            Tail::Lookahead => format!(r"{head}|\s+(?!\S)"),
            Tail::LookaheadOrOne => format!(r"{head}|\s+(?!\S)|\s+"),
        })
    }

    /// The regex folio runs: the tail as capture group 1, matched greedily; classes
    /// pinned.
    fn linear_form(&self) -> String {
        pinned(&match self.tail {
            Tail::None => self.head.to_string(),
            Tail::Lookahead | Tail::LookaheadOrOne => format!(r"(?:{})|(\s+)", self.head),
        })
    }
}

/// `pattern` with `\p{L}`, `\p{N}` and `\p{P}` replaced by the pinned Unicode version's
/// sets (a class inside a class is their union, so `[^\s\p{L}\p{N}]` keeps its meaning).
fn pinned(pattern: &str) -> String {
    pattern
        .replace(r"\p{L}", &class(LETTER))
        .replace(r"\p{N}", &class(NUMBER))
        .replace(r"\p{P}", &class(PUNCTUATION))
}

/// A regex class of inclusive code point ranges.
fn class(ranges: &[(u32, u32)]) -> String {
    let mut s = String::with_capacity(ranges.len() * 20 + 2);
    s.push('[');
    for &(a, b) in ranges {
        s.push_str(&format!(r"\x{{{a:X}}}-\x{{{b:X}}}"));
    }
    s.push(']');
    s
}

const DIGITS: Pattern = Pattern {
    head: r"\p{N}",
    tail: Tail::None,
    lookaround_head: None,
};
/// llama.cpp's default (a vocabulary without a pre-tokenizer name, or `default`):
/// punctuation runs, then GPT-2's split, then number runs, then runs of three ASCII
/// digits. The punctuation set is Unicode's and a few ASCII symbols (not the backtick).
const DEFAULT_PUNCT: Pattern = Pattern {
    head: r"[\p{P}\$\+<=>\^~\|]+",
    tail: Tail::None,
    lookaround_head: None,
};
const DEFAULT_NUMBERS: Pattern = Pattern {
    head: r"\p{N}+",
    tail: Tail::None,
    lookaround_head: None,
};
const DEFAULT_ASCII_DIGITS: Pattern = Pattern {
    head: r"[0-9][0-9][0-9]",
    tail: Tail::None,
    lookaround_head: None,
};
const GPT2: Pattern = Pattern {
    head: r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+",
    tail: Tail::Lookahead,
    lookaround_head: None,
};
// The contractions are ASCII-only in either case, as llama.cpp adapts them from the
// tokenizer.json's `(?i:'s|...)`: a Unicode case-insensitive match would also take
// `'ſ` (long s) and `'K` (Kelvin sign), which llama.cpp splits otherwise.
const LLAMA3: Pattern = Pattern {
    head: r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+",
    tail: Tail::LookaheadOrOne,
    lookaround_head: None,
};
const QWEN2: Pattern = Pattern {
    head: r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+",
    tail: Tail::LookaheadOrOne,
    lookaround_head: None,
};
/// Mistral's tekken (Nemo, Small 3): a word is optional upper-case letters then
/// lower-case ones, or the reverse, where "upper" is any letter but a-z and "lower" any
/// letter but A-Z (llama.cpp's lookahead form of the original's `\p{Lu}`/`\p{Ll}`
/// classes), one digit at a time.
const TEKKEN: Pattern = Pattern {
    head: r"[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]*[\p{L}&&[^A-Z]]+|[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]+[\p{L}&&[^A-Z]]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+",
    tail: Tail::LookaheadOrOne,
    lookaround_head: Some(
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+",
    ),
};

/// The patterns llama.cpp uses for `name` (`tokenizer.ggml.pre`; a file without one is
/// `default`). Names llama.cpp does not know (it refuses the file) get GPT-2's, with a
/// warning.
fn patterns(name: &str) -> Vec<Pattern> {
    match name {
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => {
            vec![DIGITS, GPT2]
        }
        "llama3" | "llama-bpe" | "llama-v3" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe" => vec![LLAMA3],
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan"
        | "solar-open" | "grok-2" => vec![QWEN2],
        "tekken" => vec![TEKKEN],
        "gpt2" | "gpt-2" | "phi-2" | "gigachat" | "a.x-4.0" | "mellum" | "exaone4" | "mpt"
        | "olmo" | "jais" | "trillion" | "granite-docling" => vec![GPT2],
        "default" | "" => vec![DEFAULT_PUNCT, GPT2, DEFAULT_NUMBERS, DEFAULT_ASCII_DIGITS],
        other => {
            tracing::warn!(pre = other, "unknown pre-tokenizer; using gpt2's");
            vec![GPT2]
        }
    }
}

/// One compiled pattern.
struct Rule {
    re: Regex,
    tail: Tail,
}

/// A compiled pre-tokenizer.
pub struct PreTokenizer {
    rules: Vec<Rule>,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for `name` (`tokenizer.ggml.pre`).
    pub fn for_name(name: &str) -> Result<Self, TokenizerError> {
        let rules = patterns(name)
            .into_iter()
            .map(|p| {
                Regex::new(&p.linear_form())
                    .map(|re| Rule { re, tail: p.tail })
                    .map_err(|err| TokenizerError::BadVocab(err.to_string()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { rules })
    }

    /// Splits `text` into words.
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut pieces = vec![text];
        for rule in &self.rules {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            let mut caps = rule.re.create_captures();
            for piece in pieces {
                rule.split(piece, &mut caps, &mut next);
            }
            pieces = next;
        }
        pieces
    }
}

impl Rule {
    /// The next match in `text` at or after `at`, with the lookahead applied.
    fn next_match(&self, text: &str, mut at: usize, caps: &mut Captures) -> Option<(usize, usize)> {
        loop {
            let input = Input::new(text).span(at..text.len());
            if self.tail == Tail::None {
                return self.re.search(&input).map(|m| (m.start(), m.end()));
            }
            self.re.search_captures(&input, caps);
            let m = caps.get_match()?;
            let (start, end) = (m.start(), m.end());
            if caps.get_group(1).is_none() || end == text.len() {
                return Some((start, end));
            }
            // `(\s+)` ran from `start` to a non-space at `end`: `(?!\S)` gives back the
            // last character, if one would remain.
            let last = text[start..end]
                .chars()
                .next_back()
                .map_or(0, char::len_utf8);
            if end - last > start {
                return Some((start, end - last));
            }
            match self.tail {
                Tail::LookaheadOrOne => return Some((start, end)),
                // The whole regex fails at `start`: try from the next character.
                _ => at = end,
            }
        }
    }

    /// Appends the matches of this rule in `piece`, and the text between them, to `out`.
    fn split<'t>(&self, piece: &'t str, caps: &mut Captures, out: &mut Vec<&'t str>) {
        let mut last = 0;
        while let Some((start, end)) = self.next_match(piece, last, caps) {
            if start > last {
                out.push(&piece[last..start]);
            }
            out.push(&piece[start..end]);
            last = end;
        }
        if last < piece.len() {
            out.push(&piece[last..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn smollm_splits_digits_first() {
        let p = PreTokenizer::for_name("smollm").unwrap();
        assert_eq!(p.split("abc123 def"), vec!["abc", "1", "2", "3", " def"]);
        assert_eq!(p.split("I can't  go"), vec!["I", " can", "'t", " ", " go"]);
        assert_eq!(p.split("a  1"), vec!["a", "  ", "1"]);
    }

    /// The split as folio made it with fancy-regex and llama.cpp's own regexes: the
    /// reference (fine on short text; it fails on runs of about a million characters).
    fn split_backtracking<'t>(regexes: &[fancy_regex::Regex], text: &'t str) -> Vec<&'t str> {
        let mut pieces = vec![text];
        for re in regexes {
            let mut next = Vec::new();
            for piece in pieces {
                let mut last = 0;
                for m in re.find_iter(piece) {
                    let m = m.expect("short text stays within fancy-regex's limits");
                    if m.start() > last {
                        next.push(&piece[last..m.start()]);
                    }
                    if m.end() > m.start() {
                        next.push(m.as_str());
                    }
                    last = m.end();
                }
                if last < piece.len() {
                    next.push(&piece[last..]);
                }
            }
            pieces = next;
        }
        pieces
    }

    /// Text made to stress the regexes: whitespace of every kind in runs, letters,
    /// contractions in both cases, digits, punctuation, marks, CJK, emoji, controls.
    fn stress_text(rng: &mut SplitMix64, len: usize) -> String {
        const ATOMS: &[&str] = &[
            " ", " ", "  ", "\t", "\n", "\r\n", "\r", "\u{a0}", "\u{3000}", "\u{2028}", "\u{85}",
            "\u{b}", "\u{c}", "a", "Z", "é", "ж", "ع", "中", "ſ", "'", "'s", "'S", "'ll", "'LL",
            "'re", "'ve", "'m", "'d", "'t", "1", "٣", "Ⅻ", "½", "!", "...", "-", "\u{301}", "😀",
            "👍🏽", "\u{200d}", "\0", "\u{7f}", "\u{1b}", "_", "x1", "\n\n", "'ſ", "'K", "Ab", "aB",
            "ÉCOLE", "école", "/", "ǅ",
        ];
        let mut s = String::new();
        for _ in 0..len {
            let atom = ATOMS[rng.below(ATOMS.len() as u64) as usize];
            for _ in 0..1 + rng.below(3) * rng.below(3) {
                s.push_str(atom);
            }
        }
        s
    }

    #[test]
    fn linear_splits_equal_the_backtracking_engine_on_random_text() {
        let mut rng = SplitMix64(0x5eed_7e47);
        for name in ["smollm", "llama3", "qwen2", "gpt2", "tekken", "default"] {
            let p = PreTokenizer::for_name(name).unwrap();
            let reference: Vec<fancy_regex::Regex> = patterns(name)
                .iter()
                .map(|p| fancy_regex::Regex::new(&p.llama_cpp_form()).unwrap())
                .collect();
            for i in 0..3000 {
                let text = stress_text(&mut rng, (i % 80) + 1);
                assert_eq!(
                    p.split(&text),
                    split_backtracking(&reference, &text),
                    "{name}: {text:?}"
                );
            }
        }
    }

    #[test]
    fn tekken_splits_words_at_case_changes() {
        let tekken = PreTokenizer::for_name("tekken").unwrap();
        assert_eq!(
            tekken.split("HelloWorld 2024/x"),
            vec!["Hello", "World", " ", "2", "0", "2", "4", "/x"]
        );
        assert_eq!(tekken.split("ÉCOLEécole"), vec!["ÉCOLEécole"]);
        assert_eq!(tekken.split("aBC"), vec!["a", "BC"]);
    }

    #[test]
    fn default_splits_punctuation_then_words_then_numbers_then_ascii_digit_triples() {
        let default = PreTokenizer::for_name("default").unwrap();
        assert_eq!(
            default.split("a+b=c!? `x` 12345 ٣٣٣٣"),
            vec!["a", "+", "b", "=", "c", "!?", " `", "x", "`", " ", "123", "45", " ", "٣٣٣٣"]
        );
        assert_eq!(default.split("«x»…"), vec!["«", "x", "»…"]);
    }

    #[test]
    fn letters_and_numbers_are_unicode_15_1s() {
        let smollm = PreTokenizer::for_name("smollm").unwrap();
        // U+1366C became a letter in Unicode 16.0: here it is unassigned, a symbol that
        // takes the apostrophe with it ("'s" is not split off after it).
        assert_eq!(smollm.split("\u{1366C}'s"), vec!["\u{1366C}'", "s"]);
        // U+10D40 (a Garay digit since 16.0) is no number: no split of its own.
        assert_eq!(smollm.split("!\u{10D40}?"), vec!["!\u{10D40}?"]);
        // Letters and numbers of 15.1 and before are.
        assert_eq!(smollm.split("!\u{2EBF0}٣"), vec!["!", "\u{2EBF0}", "٣"]);
    }

    #[test]
    fn whitespace_before_a_word_gives_back_one_character() {
        let gpt2 = PreTokenizer::for_name("gpt2").unwrap();
        assert_eq!(gpt2.split("a   b"), vec!["a", "  ", " b"]);
        assert_eq!(gpt2.split("a\t\tb"), vec!["a", "\t", "\t", "b"]);
        assert_eq!(gpt2.split("a\tb  "), vec!["a", "\t", "b", "  "]);
        let llama3 = PreTokenizer::for_name("llama3").unwrap();
        assert_eq!(llama3.split("a\t\tb"), vec!["a", "\t", "\tb"]);
        // ASCII contractions only: 'ſ is punctuation then a word.
        assert_eq!(llama3.split("x'S'ſ"), vec!["x", "'S", "'ſ"]);
        assert_eq!(llama3.split("a \u{3000}1"), vec!["a", " ", "\u{3000}", "1"]);
    }
}
