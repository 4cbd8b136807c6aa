//! WordPiece (`tokenizer.ggml.model = "bert"`, llama.cpp `LLAMA_VOCAB_TYPE_WPM`): llama.cpp's
//! `llm_tokenizer_wpm_session` (src/llama-vocab.cpp) over the converter's phantom-space vocabulary (a
//! word-initial piece is stored as `▁piece`, a continuation `##piece` as `piece`).
//!
//! 1. `preprocess`: split the text into words at whitespace (dropped) and around every punctuation
//!    character, every ASCII symbol and every CJK ideograph (each a word of its own); drop NUL, U+FFFD and
//!    control characters; lowercase unless `tokenizer.ggml.normalizer.lowercase` is false (llama.cpp default: on);
//! 2. per word, `▁` + word is cut greedily into the longest vocabulary pieces from the left; a word with a
//!    position no piece matches becomes the single unknown token.
//!
//! Scope: text of ASCII characters only. llama.cpp's character classes and its NFD accent stripping come
//! from its own Unicode tables, which this module does not carry; a non-ASCII character is refused with an
//! error naming it, never tokenized differently.

use std::collections::HashMap;

use crate::{Error, Result};

/// The WordPiece vocabulary: token text → id, the longest text (bytes), the unknown token, lowercasing.
pub(crate) struct WpmVocab {
    pub token_to_id: HashMap<String, u32>,
    /// llama.cpp `max_token_len`: the longest token text in bytes.
    pub max_token_len: usize,
    /// `special_unk_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.normalizer.lowercase` (llama.cpp default true).
    pub lowercase: bool,
}

/// llama.cpp `preprocess` for ASCII text. Errors: a non-ASCII character (named, with its byte offset).
fn preprocess(text: &str, lowercase: bool) -> Result<Vec<String>> {
    let mut words = vec![String::new()];
    for (at, c) in text.char_indices() {
        if !c.is_ascii() {
            return Err(Error::Unsupported(format!(
                "WordPiece (bert) tokenization of non-ASCII text is not implemented: {c:?} (U+{:04X}) at byte \
                 {at}",
                c as u32
            )));
        }
        // unicode_cpt_flags: ASCII whitespace is \t \n \v \f \r and space
        if matches!(c, ' ' | '\t' | '\n' | '\u{b}' | '\u{c}' | '\r') {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            continue;
        }
        if c == '\0' || c.is_ascii_control() {
            continue;
        }
        let c = if lowercase { c.to_ascii_lowercase() } else { c };
        // punctuation, or a symbol below 0x7F: every printable ASCII character that is not alphanumeric
        if c.is_ascii_punctuation() {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            if let Some(w) = words.last_mut() {
                w.push(c);
            }
            words.push(String::new());
        } else if let Some(w) = words.last_mut() {
            w.push(c);
        }
    }
    if words.last().is_some_and(String::is_empty) {
        words.pop();
    }
    Ok(words)
}

/// Tokenize one text fragment, appending to `out` (`llm_tokenizer_wpm_session::tokenize`).
///
/// Errors: non-ASCII text ([`preprocess`]); a word without pieces when the vocabulary has no unknown token.
pub(crate) fn tokenize(v: &WpmVocab, text: &str, out: &mut Vec<u32>) -> Result<()> {
    for word in preprocess(text, v.lowercase)? {
        if word.is_empty() {
            continue;
        }
        let w = format!("\u{2581}{word}");
        let n = w.len();
        let start = out.len();
        let mut i = 0;
        while i < n {
            let mut matched = false;
            // longest first; `w` is ASCII after its 3-byte `▁`, so cut only at char boundaries
            let mut j = n.min(i + v.max_token_len + 1);
            while j > i {
                if w.is_char_boundary(i) && w.is_char_boundary(j) {
                    if let Some(&id) = v.token_to_id.get(&w[i..j]) {
                        out.push(id);
                        matched = true;
                        i = j;
                        break;
                    }
                }
                j -= 1;
            }
            if !matched {
                out.truncate(start);
                break;
            }
        }
        if out.len() == start {
            out.push(v.unk.ok_or_else(|| {
                Error::Tokenizer(format!(
                    "word {word:?} has no WordPiece tokens and the vocabulary has no unknown token"
                ))
            })?);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[&str]) -> WpmVocab {
        WpmVocab {
            token_to_id: tokens
                .iter()
                .enumerate()
                .map(|(i, t)| (t.to_string(), i as u32))
                .collect(),
            max_token_len: tokens.iter().map(|t| t.len()).max().unwrap_or(0),
            unk: Some(0),
            lowercase: false,
        }
    }

    #[test]
    fn splits_words_and_punctuation_like_llama_cpp() {
        assert_eq!(
            preprocess("  Hi,there!\tx\u{7}y ", false).unwrap(),
            ["Hi", ",", "there", "!", "xy"]
        );
        assert_eq!(preprocess("A+b", true).unwrap(), ["a", "+", "b"]);
        assert!(preprocess("", false).unwrap().is_empty());
        let e = preprocess("caf\u{e9}", false).unwrap_err().to_string();
        assert!(e.contains("U+00E9") && e.contains("byte 3"), "{e}");
    }

    #[test]
    fn longest_pieces_first_and_unknown_words() {
        let v = vocab(&["[UNK]", "▁he", "ll", "▁h", "e", "l", "o", "▁!"]);
        let mut out = Vec::new();
        tokenize(&v, "hello !", &mut out).unwrap();
        assert_eq!(out, [1, 2, 6, 7]);
        // a word with a position no piece matches: all of it becomes [UNK]
        out.clear();
        tokenize(&v, "hex he", &mut out).unwrap();
        assert_eq!(out, [0, 1]);
    }
}
