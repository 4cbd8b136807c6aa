//! Fuzz the golden reader (`lockstep::golden::GoldenFile`): any byte string, held to a fixed manifest
//! entry (T = 2 prompt tokens, vocabulary 8, top-4, 1 decode step, one f16 stage — the entry of
//! `seeds/golden_read/tiny.npz`, written by `make_seeds.py`), must pass `verify_contents` or be refused —
//! never a panic — and a golden that passes must read back every array it lists.

#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use lockstep::golden::{GoldenEntry, GoldenFile};

fn entry() -> &'static GoldenEntry {
    static E: OnceLock<GoldenEntry> = OnceLock::new();
    E.get_or_init(|| {
        let spec = |shape: &[usize], dtype: &str| {
            serde_json::json!({"shape": shape, "dtype": dtype,
                               "storage_max_abs_err": 0.0, "storage_max_rel_err": 0.0})
        };
        serde_json::from_value(serde_json::json!({
            "path": "fuzz/llama.cpp-f32kv/tiny.npz", "sha256": "0".repeat(64),
            "model_id": "fuzz", "model_sha256": "0".repeat(64), "model_file": "fuzz.gguf",
            "arch": "llama", "prompt_id": "tiny", "prompt": "hi", "add_special": true,
            "parse_special": false, "oracle": {"name": "llama.cpp"}, "kv_type": "f32",
            "settings": {}, "n_prompt_tokens": 2, "n_decode_steps": 1, "continuation": "x",
            "capture_changes_logits": 0.0,
            "arrays": {
                "tokens": spec(&[2], "i32"),
                "logits": spec(&[1, 8], "f32"),
                "logits_positions": spec(&[1], "i32"),
                "logits_topk_ids": spec(&[2, 4], "i32"),
                "logits_topk": spec(&[2, 4], "f32"),
                "decode.tokens": spec(&[1], "i32"),
                "decode.logits": spec(&[1, 8], "f32"),
                "blk.0.out": spec(&[2, 4], "f16"),
                "decode.blk.0.out": spec(&[1, 4], "f16"),
            }
        }))
        .unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let e = entry();
    let Ok(mut g) = GoldenFile::from_bytes(
        data.to_vec(),
        e.clone(),
        Path::new("fuzz.npz"),
        Path::new("manifest.json"),
    ) else {
        return;
    };
    if g.verify_contents().is_ok() {
        for (name, spec) in &e.arrays {
            if spec.dtype == lockstep::golden::Dtype::I32 {
                g.read_i32(name).unwrap();
            } else {
                let a = g.read_f32(name).unwrap();
                assert!(a.iter().all(|v| v.is_finite()));
            }
        }
        g.read_ids("logits_topk_ids", 8).unwrap();
    }
});
