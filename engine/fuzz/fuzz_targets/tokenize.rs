//! Fuzz the tokenizers: any byte string (taken as text, invalid UTF-8 replaced by U+FFFD as a CLI argument
//! would be lossily converted) must tokenize without panicking, with and without BOS and special-token
//! parsing, to ids inside the vocabulary, the same ids on a second call, and decode without panicking.
//!
//! `decode(encode(text)) == text` is *not* asserted: llama.cpp's `llama_tokenize` drops bytes its
//! vocabulary has no token for (SmolLM2's BPE drops U+0004, found by this target), and lockstep
//! reproduces llama.cpp, not an ideal tokenizer.
//!
//! Tokenizers: the synthetic byte-level BPE of `lockstep_engine::synth::SynthModel`, plus every GGUF
//! named in `$LOCKSTEP_FUZZ_GGUF` (colon-separated paths, e.g. the cached SmolLM2, Gemma 3 and Qwen2.5
//! files: byte-level BPE with the smollm and qwen2 pre-tokenizers, and SentencePiece).

#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use lockstep_engine::synth::SynthModel;
use lockstep_engine::gguf::GgufFile;
use lockstep_engine::tokenizer::Tokenizer;

fn tokenizers() -> &'static [(String, Tokenizer)] {
    static TOKS: OnceLock<Vec<(String, Tokenizer)>> = OnceLock::new();
    TOKS.get_or_init(|| {
        let tiny = GgufFile::from_bytes(SynthModel::default().build().unwrap(), "tiny").unwrap();
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
            let again = t.encode(&text, add_special, parse_special).ok();
            assert_eq!(again.as_ref(), Some(&ids), "{name}: encode is not deterministic");
            let _ = t.decode(&ids);
        }
    }
});
