//! Fuzz the tokenizers: any byte string (taken as text, invalid UTF-8 replaced by U+FFFD as a prompt file
//! would be refused or a CLI argument would be lossily converted) must tokenize without panicking, with
//! and without special-token parsing, to ids inside the vocabulary; and decoding the ids of a plain encode
//! (no BOS, no special parsing) must give the text back byte for byte.
//!
//! Tokenizers: the synthetic byte-level BPE of `lockstep_engine::fixtures::TinyLlama`, plus every GGUF
//! named in `$LOCKSTEP_FUZZ_GGUF` (colon-separated paths, e.g. the cached SmolLM2, Gemma 3 and Qwen2.5
//! files: byte-level BPE with the smollm and qwen2 pre-tokenizers, and SentencePiece).

#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use lockstep_engine::fixtures::TinyLlama;
use lockstep_engine::gguf::GgufFile;
use lockstep_engine::tokenizer::Tokenizer;

fn tokenizers() -> &'static [(String, Tokenizer)] {
    static TOKS: OnceLock<Vec<(String, Tokenizer)>> = OnceLock::new();
    TOKS.get_or_init(|| {
        let tiny = GgufFile::from_bytes(TinyLlama::default().build().unwrap(), "tiny").unwrap();
        let mut v = vec![("tiny".to_string(), Tokenizer::from_gguf(&tiny).unwrap())];
        if let Ok(list) = std::env::var("LOCKSTEP_FUZZ_GGUF") {
            for p in list.split(':').filter(|p| !p.is_empty()) {
                let g = GgufFile::open(Path::new(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
                v.push((p.to_string(), Tokenizer::from_gguf(&g).unwrap()));
            }
        }
        v
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for (name, t) in tokenizers() {
        for (add_special, parse_special) in [(true, false), (true, true), (false, false)] {
            let Ok(ids) = t.encode(&text, add_special, parse_special) else {
                continue;
            };
            for &id in &ids {
                assert!((id as usize) < t.vocab_size(), "{name}: id {id} outside the vocabulary");
            }
            let back = t.decode(&ids);
            if !add_special && !parse_special {
                assert_eq!(back, text, "{name}: decode(encode(text)) != text");
            }
        }
    }
});
