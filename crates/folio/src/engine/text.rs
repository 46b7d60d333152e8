//! Generated text as it may be shown: the streaming UTF-8 decoder plus stop strings.
//! Text that could still turn into a stop string is held back; a stop string and
//! everything after it is never released.

use crate::tokenizer::{StreamDecoder, Tokenizer};

/// One sample's text: decoded token by token, stop strings held back.
pub struct TextOut {
    decoder: StreamDecoder,
    text: String,
    emitted: usize,
    stops: Vec<String>,
    /// The stop string that ended the text, once one did.
    matched: Option<String>,
}

impl TextOut {
    pub fn new(stops: &[String]) -> Self {
        Self {
            decoder: StreamDecoder::default(),
            text: String::new(),
            emitted: 0,
            stops: stops.to_vec(),
            matched: None,
        }
    }

    /// Adds token `id`: returns the text that became final (possibly empty) and whether
    /// a stop string appeared (the text then ends before it).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> (String, bool) {
        self.text.push_str(&self.decoder.push(tok, id));
        if let Some(at) = find_stop(&self.text, &self.stops, self.emitted) {
            let rest = &self.text[at..];
            self.matched = self
                .stops
                .iter()
                .find(|s| !s.is_empty() && rest.starts_with(s.as_str()))
                .cloned();
            self.text.truncate(at);
            let delta = self.text[self.emitted.min(at)..].to_string();
            self.emitted = at;
            return (delta, true);
        }
        let safe = self.text.len() - held_back(&self.text, &self.stops);
        if safe > self.emitted {
            let delta = self.text[self.emitted..safe].to_string();
            self.emitted = safe;
            return (delta, false);
        }
        (String::new(), false)
    }

    /// At the end without a stop: everything not yet released.
    pub fn finish(&mut self) -> String {
        self.text.push_str(&self.decoder.finish());
        let delta = self.text[self.emitted..].to_string();
        self.emitted = self.text.len();
        delta
    }

    /// The stop strings.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// The stop string that ended the text (the first listed of those found where it
    /// ends), once one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }
}

/// The byte offset of the first stop string that ends after `from`.
fn find_stop(text: &str, stops: &[String], from: usize) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| {
            let start = floor_char(text, from.saturating_sub(s.len()));
            text[start..].find(s.as_str()).map(|i| start + i)
        })
        .min()
}

/// How many bytes at the end of `text` could be the start of a stop string.
fn held_back(text: &str, stops: &[String]) -> usize {
    let mut keep = 0;
    for s in stops {
        for n in (1..s.len().min(text.len() + 1)).rev() {
            if n > keep
                && text.is_char_boundary(text.len() - n)
                && s.starts_with(&text[text.len() - n..])
            {
                keep = n;
                break;
            }
        }
    }
    keep
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_are_found_and_held_back() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        assert_eq!(find_stop("abc EN", &stops, 0), None);
        assert_eq!(held_back("abc EN", &stops), 2);
        assert_eq!(find_stop("abc END", &stops, 4), Some(4));
        assert_eq!(held_back("abc\n", &stops), 1);
        assert_eq!(held_back("abc", &stops), 0);
        assert_eq!(find_stop("é\n\n", &stops, 2), Some(2));
    }

    #[test]
    fn the_stop_string_that_ended_the_text_is_named() {
        let tok = crate::tokenizer::test_support::smollm();
        let stops = ["zzz".to_string(), "sea".to_string(), "se".to_string()];
        let mut out = TextOut::new(&stops);
        let mut shown = String::new();
        let mut stopped = false;
        for id in tok.encode("The sea is wide", false) {
            let (text, stop) = out.push(tok, id);
            shown.push_str(&text);
            if stop {
                stopped = true;
                break;
            }
        }
        assert!(stopped);
        assert_eq!(shown, "The ");
        // "sea" and "se" both start there: the first listed is named.
        assert_eq!(out.matched(), Some("sea"));
        assert_eq!(TextOut::new(&stops).matched(), None);
    }
}
