//! Tokenizer built from GGUF metadata, on the `tokenizers` crate.
//!
//! Supported: `tokenizer.ggml.model = "gpt2"` (byte-level BPE) with the pre-tokenizers llama.cpp knows for the
//! models we run. The behaviour mirrors llama.cpp's `llama_tokenize(text, add_special, parse_special)`
//! (src/llama-vocab.cpp, `llama_vocab::impl::tokenize`):
//! 1. with `parse_special`, the text is first partitioned on the exact strings of CONTROL tokens, longest
//!    first (`tokenizer_st_partition`); without it, control tokens in the text are plain text;
//! 2. each text fragment is pre-tokenized with the model's regexes (`tokenizer.ggml.pre`) and byte-level BPE
//!    encoded with the GGUF merges (rank = position in `tokenizer.ggml.merges`);
//! 3. with `add_special`, BOS / EOS are added when `tokenizer.ggml.add_bos_token` /
//!    `tokenizer.ggml.add_eos_token` say so.
//!
//! Decoding maps each token back to bytes through GPT-2's byte↔unicode table (`bytes_to_unicode` in
//! OpenAI's GPT-2 encoder; llama.cpp `llama_decode_text`) and skips control tokens.

use std::collections::HashMap;

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// llama.cpp's token attribute for control tokens (`LLAMA_TOKEN_TYPE_CONTROL` in GGUF `token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;

/// Texts llama.cpp treats as end-of-generation when they are control tokens (`llama_vocab::impl::load`,
/// the `special_eog_ids` heuristics).
const EOG_TEXTS: &[&str] = &[
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<end_of_turn>",
    "<|end|>",
    "</s>",
];

/// A tokenizer for one model file: encode text to token ids and decode ids to text.
pub struct Tokenizer {
    bpe: tokenizers::Tokenizer,
    /// Token text as stored in the GGUF (byte-level unicode form), indexed by id.
    tokens: Vec<String>,
    /// GGUF `tokenizer.ggml.token_type` per id (1 normal, 3 control, 4 user-defined, ...).
    token_types: Vec<i32>,
    /// Control tokens sorted by text length, longest first (the partition order).
    specials: Vec<(String, u32)>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<u32>,
    unicode_to_byte: HashMap<char, u8>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

/// GPT-2's reversible byte → printable-unicode map (OpenAI `bytes_to_unicode`).
fn bytes_to_unicode() -> Vec<(u8, char)> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = printable.clone();
    let mut n = 0;
    for b in 0u32..256 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    printable
        .into_iter()
        .zip(chars)
        .map(|(b, c)| {
            (
                b as u8,
                char::from_u32(c).expect("GPT-2 byte map is valid unicode"),
            )
        })
        .collect()
}

/// The pre-tokenizer regexes llama.cpp uses for a `tokenizer.ggml.pre` value (src/llama-vocab.cpp,
/// `llm_tokenizer_bpe` constructor). Returns the regexes that run before the byte-level split.
fn pre_tokenizer_for(pre: &str) -> Result<PreTokenizerWrapper> {
    let byte_level = ByteLevel::new(false, false, true);
    let split = |re: &str| -> Result<PreTokenizerWrapper> {
        Ok(Split::new(
            SplitPattern::Regex(re.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| Error::Tokenizer(format!("bad pre-tokenizer regex {re:?}: {e}")))?
        .into())
    };
    match pre {
        // STARCODER / REFACT / COMMAND_R / SMOLLM / CODESHELL / EXAONE / MINERVA: digits split one by
        // one, then the GPT-2 regex (which ByteLevel applies with use_regex = true).
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            Ok(Sequence::new(vec![split(r"\p{N}")?, byte_level.into()]).into())
        }
        // GPT2 / MPT / OLMO / JAIS / TRILLION / GRANITE_DOCLING: the GPT-2 regex alone.
        "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" | "default" => Ok(byte_level.into()),
        other => Err(Error::Unsupported(format!(
            "tokenizer.ggml.pre = {other:?} is not supported yet (supported: smollm, starcoder, gpt-2, ...)"
        ))),
    }
}

impl Tokenizer {
    /// Build the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    ///
    /// Errors: a missing or mistyped key (named), an unsupported `tokenizer.ggml.model` or
    /// `tokenizer.ggml.pre`, malformed merges.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(Error::Unsupported(format!(
                "{}: tokenizer.ggml.model = {model:?} is not supported yet (only \"gpt2\" byte-level BPE)",
                gguf.path().display()
            )));
        }
        let pre = match gguf.get("tokenizer.ggml.pre") {
            Some(_) => gguf.get_str("tokenizer.ggml.pre")?.to_string(),
            None => "default".to_string(),
        };
        let tokens: Vec<String> = gguf
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_string)
            .collect();
        let token_types = match gguf.get("tokenizer.ggml.token_type") {
            Some(_) => gguf.get_i32_array("tokenizer.ggml.token_type")?,
            None => vec![1; tokens.len()],
        };
        if token_types.len() != tokens.len() {
            return Err(Error::Model {
                path: gguf.path().to_path_buf(),
                what: format!(
                    "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
                    token_types.len(),
                    tokens.len()
                ),
            });
        }
        let merges_raw = gguf.get_str_array("tokenizer.ggml.merges")?;
        let mut merges = Vec::with_capacity(merges_raw.len());
        for (i, m) in merges_raw.iter().enumerate() {
            let (a, b) = m.split_once(' ').ok_or_else(|| Error::Model {
                path: gguf.path().to_path_buf(),
                what: format!(
                    "tokenizer.ggml.merges[{i}] = {m:?} is not two space-separated parts"
                ),
            })?;
            merges.push((a.to_string(), b.to_string()));
        }
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| {
                Error::Tokenizer(format!("{}: building BPE: {e}", gguf.path().display()))
            })?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer_for(&pre)?));

        let opt_u32 = |key: &str| -> Result<Option<u32>> {
            match gguf.get(key) {
                Some(_) => gguf.get_u32(key).map(Some),
                None => Ok(None),
            }
        };
        let opt_bool = |key: &str, default: bool| -> Result<bool> {
            match gguf.get(key) {
                Some(_) => gguf.get_bool(key),
                None => Ok(default),
            }
        };
        let bos = opt_u32("tokenizer.ggml.bos_token_id")?;
        let eos = opt_u32("tokenizer.ggml.eos_token_id")?;
        // llama.cpp's default for BPE vocabularies: add BOS unless the file says otherwise.
        let add_bos = opt_bool("tokenizer.ggml.add_bos_token", true)?;
        let add_eos = opt_bool("tokenizer.ggml.add_eos_token", false)?;
        for (key, id) in [("bos", bos), ("eos", eos)] {
            if let Some(id) = id {
                if id as usize >= tokens.len() {
                    return Err(Error::Model {
                        path: gguf.path().to_path_buf(),
                        what: format!(
                            "tokenizer.ggml.{key}_token_id = {id} is outside the vocabulary ({})",
                            tokens.len()
                        ),
                    });
                }
            }
        }

        let mut specials: Vec<(String, u32)> = token_types
            .iter()
            .enumerate()
            .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL)
            .map(|(i, _)| (tokens[i].clone(), i as u32))
            .filter(|(s, _)| !s.is_empty())
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut eog: Vec<u32> = eos.into_iter().collect();
        for (text, id) in &specials {
            if EOG_TEXTS.contains(&text.as_str()) && !eog.contains(id) {
                eog.push(*id);
            }
        }
        let unicode_to_byte = bytes_to_unicode()
            .into_iter()
            .map(|(b, c)| (c, b))
            .collect();
        Ok(Tokenizer {
            bpe: inner,
            tokens,
            token_types,
            specials,
            bos,
            eos,
            add_bos,
            add_eos,
            eog,
            unicode_to_byte,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The beginning-of-sequence token id, if the model has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token id, if the model has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS (GGUF `tokenizer.ggml.add_bos_token`).
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// True for tokens that end generation (EOS and the end-of-turn control tokens).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Encode text to token ids as llama.cpp's `llama_tokenize(text, add_special, parse_special)` does.
    ///
    /// Errors: a BPE failure inside the `tokenizers` crate (should not happen for byte-level BPE).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if add_special && self.add_bos {
            if let Some(b) = self.bos {
                ids.push(b);
            }
        }
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Special(id) => ids.push(id),
                Fragment::Text("") => {}
                Fragment::Text(t) => {
                    let enc = self
                        .bpe
                        .encode(t, false)
                        .map_err(|e| Error::Tokenizer(format!("encoding {t:?}: {e}")))?;
                    ids.extend_from_slice(enc.get_ids());
                }
            }
        }
        if add_special && self.add_eos {
            if let Some(e) = self.eos {
                ids.push(e);
            }
        }
        Ok(ids)
    }

    /// Split `text` on control-token strings, longest first (llama.cpp `tokenizer_st_partition`).
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = vec![Fragment::Text(text)];
        if !parse_special {
            return frags;
        }
        for (special, id) in &self.specials {
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                match f {
                    Fragment::Text(t) => {
                        let mut rest = t;
                        while let Some(at) = rest.find(special.as_str()) {
                            if at > 0 {
                                next.push(Fragment::Text(&rest[..at]));
                            }
                            next.push(Fragment::Special(*id));
                            rest = &rest[at + special.len()..];
                        }
                        if !rest.is_empty() {
                            next.push(Fragment::Text(rest));
                        }
                    }
                    s => next.push(s),
                }
            }
            frags = next;
        }
        frags
    }

    /// The raw bytes a token stands for (control tokens give their text; unknown ids give nothing).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(text) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        if self.token_types.get(id as usize) == Some(&TOKEN_TYPE_CONTROL) {
            return text.as_bytes().to_vec();
        }
        let mut out = Vec::with_capacity(text.len());
        for c in text.chars() {
            match self.unicode_to_byte.get(&c) {
                Some(&b) => out.push(b),
                None => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        out
    }

    /// Decode token ids to text, skipping control tokens; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            if self.token_types.get(id as usize) == Some(&TOKEN_TYPE_CONTROL) {
                continue;
            }
            bytes.extend(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The token's text as stored in the GGUF vocabulary (byte-level form), for diagnostics.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }
}

enum Fragment<'t> {
    Text(&'t str),
    Special(u32),
}

/// Streams decoded text token by token, holding back bytes until they form complete UTF-8.
#[derive(Debug, Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// Feed one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        if tok.token_types.get(id as usize) == Some(&TOKEN_TYPE_CONTROL) {
            return String::new();
        }
        self.pending.extend(tok.token_bytes(id));
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                let out = s.to_string();
                self.pending.clear();
                out
            }
            Err(e) if e.error_len().is_none() => {
                // Incomplete sequence at the end: emit the valid prefix, keep the tail.
                let valid = e.valid_up_to();
                let out = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
                self.pending.drain(..valid);
                out
            }
            Err(_) => {
                let out = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                out
            }
        }
    }

    /// Flush whatever is left (invalid bytes become U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        let m = bytes_to_unicode();
        assert_eq!(m.len(), 256);
        let mut chars: Vec<char> = m.iter().map(|p| p.1).collect();
        chars.sort();
        chars.dedup();
        assert_eq!(chars.len(), 256);
        // Space maps to 'Ġ' (U+0120), newline to 'Ċ' (U+010A), as in every GPT-2 vocabulary.
        assert!(m.contains(&(b' ', '\u{120}')));
        assert!(m.contains(&(b'\n', '\u{10A}')));
    }
}
