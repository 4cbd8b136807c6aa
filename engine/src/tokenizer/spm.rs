//! SentencePiece-style tokenization of `tokenizer.ggml.model = "llama"` vocabularies (Gemma, LLaMA 1/2, ...),
//! a line-for-line port of llama.cpp's `llm_tokenizer_spm_session::tokenize` (src/llama-vocab.cpp).
//!
//! The text (spaces already escaped as U+2581 by the caller) is split into UTF-8 characters; every adjacent
//! pair whose concatenation is a vocabulary token is a candidate bigram, scored by that token's
//! `tokenizer.ggml.scores` entry. The best bigram (highest score, then leftmost) is merged repeatedly, and
//! stale candidates are recognised by their byte length. Symbols that are not tokens at the end (single
//! characters missing from the vocabulary) fall back to byte tokens `<0xXX>`.
//!
//! This is not done with `tokenizers::models::bpe::BPE`: its merges are a ranked list of pairs, while
//! llama.cpp merges *any* adjacent pair whose concatenation is in the vocabulary, ordered by score, so a
//! merge list derived from scores (as HF's `LlamaConverter` builds) can disagree with llama.cpp.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::{Error, Result};

/// The parts of the vocabulary the SPM algorithm reads.
pub(super) struct SpmVocab {
    /// Token text → id (llama.cpp `token_to_id`: the last id wins for duplicate texts).
    pub token_to_id: HashMap<String, u32>,
    /// `tokenizer.ggml.scores` (0.0 where the file has none).
    pub scores: Vec<f32>,
}

impl SpmVocab {
    /// llama.cpp `llama_vocab::byte_to_token` for SPM: `<0xXX>` (upper-case hex), else the byte as a
    /// one-character token.
    fn byte_to_token(&self, b: u8) -> Result<u32> {
        if let Some(&id) = self.token_to_id.get(format!("<0x{b:02X}>").as_str()) {
            return Ok(id);
        }
        if b.is_ascii() {
            if let Some(&id) = self.token_to_id.get((b as char).to_string().as_str()) {
                return Ok(id);
            }
        }
        Err(Error::Tokenizer(format!(
            "SPM vocabulary has no byte token <0x{b:02X}> for byte fallback"
        )))
    }
}

/// `llm_symbol`: a byte range of the text, linked to its live neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    n: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// `llm_bigram_spm`, ordered as llama.cpp's priority queue pops it: highest score first, then leftmost.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// `llm_bigram_spm::comparator` (`l < r` when `l.score < r.score || (l.score == r.score && l.left >
    /// r.left)`); incomparable scores (NaN) count as equal, as the C++ `<` does.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Tokenize one text fragment (spaces already escaped) and append the ids to `out`: llama.cpp
/// `llm_tokenizer_spm_session::tokenize`.
///
/// Errors: a character that is not a token needs a byte token the vocabulary lacks.
pub(super) fn tokenize(vocab: &SpmVocab, text: &str, out: &mut Vec<u32>) -> Result<()> {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    let n_chars = text.chars().count();
    for (i, (start, c)) in text.char_indices().enumerate() {
        symbols.push(Symbol {
            start,
            n: c.len_utf8(),
            prev: i.checked_sub(1),
            next: (i + 1 < n_chars).then_some(i + 1),
        });
    }

    let mut queue = BinaryHeap::new();
    let try_add_bigram = |symbols: &[Symbol],
                          queue: &mut BinaryHeap<Bigram>,
                          left: Option<usize>,
                          right: Option<usize>| {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (symbols[left], symbols[right]);
        let piece = &text[l.start..l.start + l.n + r.n];
        if let Some(&id) = vocab.token_to_id.get(piece) {
            queue.push(Bigram {
                left,
                right,
                score: vocab.scores.get(id as usize).copied().unwrap_or(0.0),
                size: piece.len(),
            });
        }
    };

    for i in 1..symbols.len() {
        try_add_bigram(&symbols, &mut queue, Some(i - 1), Some(i));
    }

    while let Some(bigram) = queue.pop() {
        let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
        // One of the symbols already got merged: the candidate is stale.
        if l.n == 0 || r.n == 0 || l.n + r.n != bigram.size {
            continue;
        }
        // Merge the right symbol into the left one and unlink it.
        symbols[bigram.left].n += r.n;
        symbols[bigram.right].n = 0;
        symbols[bigram.left].next = r.next;
        if let Some(next) = r.next {
            symbols[next].prev = Some(bigram.left);
        }
        let (prev, next) = (symbols[bigram.left].prev, symbols[bigram.left].next);
        try_add_bigram(&symbols, &mut queue, prev, Some(bigram.left));
        try_add_bigram(&symbols, &mut queue, Some(bigram.left), next);
    }

    // `resegment`: every merged symbol is a token by construction; a leftover single character that is
    // not one becomes its UTF-8 bytes. (llama.cpp's `rev_merge` fallback is only reachable for merged
    // symbols, which are always tokens, so it is not needed.)
    let mut at = if symbols.is_empty() { None } else { Some(0) };
    while let Some(i) = at {
        let s = symbols[i];
        let piece = &text[s.start..s.start + s.n];
        match vocab.token_to_id.get(piece) {
            Some(&id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    out.push(vocab.byte_to_token(b)?);
                }
            }
        }
        at = s.next;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(entries: &[(&str, f32)]) -> SpmVocab {
        let mut token_to_id = HashMap::new();
        let mut scores = Vec::new();
        for (i, (t, s)) in entries.iter().enumerate() {
            token_to_id.insert(t.to_string(), i as u32);
            scores.push(*s);
        }
        SpmVocab {
            token_to_id,
            scores,
        }
    }

    #[test]
    fn merges_by_score_then_leftmost_and_falls_back_to_bytes() {
        let mut entries: Vec<(String, f32)> =
            (0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0)).collect();
        for (t, s) in [
            ("a", -1.0),
            ("b", -1.0),
            ("ab", -2.0),
            ("bb", -3.0),
            ("abb", -1.5),
        ] {
            entries.push((t.to_string(), s));
        }
        let refs: Vec<(&str, f32)> = entries.iter().map(|(t, s)| (t.as_str(), *s)).collect();
        let v = vocab(&refs);
        let id = |t: &str| v.token_to_id[t];
        let mut out = Vec::new();
        // "ab" (-2) beats "bb" (-3); then "ab"+"b" = "abb" (-1.5).
        tokenize(&v, "abb", &mut out).unwrap();
        assert_eq!(out, vec![id("abb")]);
        // Equal scores: the leftmost pair merges first ("ab" + "ab"... then no "abab").
        out.clear();
        tokenize(&v, "abab", &mut out).unwrap();
        assert_eq!(out, vec![id("ab"), id("ab")]);
        // 'é' is not a token: its two UTF-8 bytes.
        out.clear();
        tokenize(&v, "é", &mut out).unwrap();
        assert_eq!(out, vec![id("<0xC3>"), id("<0xA9>")]);
        out.clear();
        tokenize(&v, "", &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn missing_byte_token_is_an_error() {
        let v = vocab(&[("a", 0.0)]);
        let mut out = Vec::new();
        let e = tokenize(&v, "é", &mut out).unwrap_err().to_string();
        assert!(e.contains("<0xC3>"), "{e}");
    }
}
