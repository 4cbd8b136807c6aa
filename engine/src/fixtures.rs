//! Tiny synthetic models for tests: a complete, valid GGUF file built in memory with random weights.
//!
//! The file has every tensor and metadata key a real `llama` GGUF has (byte-level BPE vocabulary of the
//! 256 GPT-2 byte tokens plus a few merges and control tokens, `tokenizer.ggml.pre = smollm`), at a size
//! where a forward pass takes microseconds. Weights are deterministic for a given seed.

use crate::gguf::{GgufWriter, MetaValue};
use crate::quant::{quantize_row, GgmlType};

/// Shape and types of a synthetic decoder model: `llama` by default, or `qwen2` (adds Q/K/V biases) or
/// `gemma3` (adds per-head Q/K norms, post-attention and post-FFN norms, a sliding window of
/// [`TINY_GEMMA3_WINDOW`] positions) through [`TinyLlama::arch`].
#[derive(Clone, Debug)]
pub struct TinyLlama {
    /// `general.architecture`: `llama`, `qwen2` or `gemma3`.
    pub arch: &'static str,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Residual width (multiple of 32 for block types).
    pub d_model: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
    /// FFN width (multiple of 32).
    pub d_ff: usize,
    /// Type of the projection matrices.
    pub matrix_type: GgmlType,
    /// Type of `token_embd` (also the tied output).
    pub embd_type: GgmlType,
    /// RMSNorm epsilon written to the metadata.
    pub norm_eps: f32,
    /// Weight seed.
    pub seed: u64,
}

impl Default for TinyLlama {
    fn default() -> Self {
        TinyLlama {
            arch: "llama",
            n_layer: 2,
            d_model: 64,
            n_head: 4,
            n_kv_head: 2,
            d_ff: 128,
            matrix_type: GgmlType::Q4_1,
            embd_type: GgmlType::Q8_0,
            norm_eps: 1e-5,
            seed: 1,
        }
    }
}

/// Sliding window written to a synthetic `gemma3` file (short, so that tests cross it).
pub const TINY_GEMMA3_WINDOW: u32 = 3;

/// Control tokens of the synthetic vocabulary (ids 0..3).
pub const TINY_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Merges of the synthetic vocabulary (byte-level form; `Ġ` is a space).
pub const TINY_MERGES: [&str; 4] = ["h e", "l l", "he ll", "Ġ t"];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// GPT-2's printable form of each byte, indexed by byte (the tokenizer's table).
fn byte_chars() -> Vec<char> {
    let mut out = vec!['\0'; 256];
    for (b, c) in crate::tokenizer::bytes_to_unicode() {
        out[b as usize] = c;
    }
    out
}

impl TinyLlama {
    /// Vocabulary: 3 control tokens, 256 byte tokens, then one token per merge.
    pub fn vocab(&self) -> Vec<String> {
        let mut v: Vec<String> = TINY_SPECIALS.iter().map(|s| s.to_string()).collect();
        v.extend(byte_chars().into_iter().map(String::from));
        v.extend(TINY_MERGES.iter().map(|m| m.replace(' ', "")));
        v
    }

    /// Build the GGUF file bytes.
    ///
    /// Errors: a matrix type whose quantizer the engine lacks, or widths that are not whole blocks.
    pub fn build(&self) -> crate::Result<Vec<u8>> {
        let mut rng = Rng(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let head_dim = self.d_model / self.n_head;
        let vocab = self.vocab();
        let n_vocab = vocab.len();
        let mut w = GgufWriter::new();
        let s = |x: &str| MetaValue::String(x.to_string());
        let u = MetaValue::U32;
        let a = self.arch;
        let key = |k: &str| format!("{a}.{k}");
        w.add_metadata("general.architecture", s(a));
        w.add_metadata("general.name", s(&format!("tiny-{a} (synthetic)")));
        w.add_metadata(&key("block_count"), u(self.n_layer as u32));
        w.add_metadata(&key("context_length"), u(256));
        w.add_metadata(&key("embedding_length"), u(self.d_model as u32));
        w.add_metadata(&key("feed_forward_length"), u(self.d_ff as u32));
        w.add_metadata(&key("attention.head_count"), u(self.n_head as u32));
        w.add_metadata(&key("attention.head_count_kv"), u(self.n_kv_head as u32));
        w.add_metadata(&key("rope.freq_base"), MetaValue::F32(10000.0));
        w.add_metadata(&key("rope.dimension_count"), u(head_dim as u32));
        w.add_metadata(
            &key("attention.layer_norm_rms_epsilon"),
            MetaValue::F32(self.norm_eps),
        );
        if a == "gemma3" {
            w.add_metadata(&key("attention.sliding_window"), u(TINY_GEMMA3_WINDOW));
        }
        w.add_metadata("tokenizer.ggml.model", s("gpt2"));
        w.add_metadata("tokenizer.ggml.pre", s("smollm"));
        w.add_metadata(
            "tokenizer.ggml.tokens",
            MetaValue::Array(vocab.iter().map(|t| s(t)).collect()),
        );
        let types = (0..n_vocab)
            .map(|i| MetaValue::I32(if i < TINY_SPECIALS.len() { 3 } else { 1 }))
            .collect();
        w.add_metadata("tokenizer.ggml.token_type", MetaValue::Array(types));
        w.add_metadata(
            "tokenizer.ggml.merges",
            MetaValue::Array(TINY_MERGES.iter().map(|m| s(m)).collect()),
        );
        w.add_metadata("tokenizer.ggml.bos_token_id", u(1));
        w.add_metadata("tokenizer.ggml.eos_token_id", u(2));
        w.add_metadata("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));

        // A [rows, cols] tensor of offset + U(-scale, scale), quantized row by row; 1-D when rows == 1.
        let mut tensor = |w: &mut GgufWriter,
                          name: &str,
                          rows: usize,
                          cols: usize,
                          ty: GgmlType,
                          offset: f32,
                          scale: f32| {
            let vals: Vec<f32> = (0..rows * cols)
                .map(|_| offset + rng.next() * scale)
                .collect();
            let mut bytes = Vec::new();
            for row in vals.chunks_exact(cols) {
                bytes.extend(quantize_row(ty, row)?);
            }
            let dims: Vec<u64> = if rows == 1 {
                vec![cols as u64]
            } else {
                vec![cols as u64, rows as u64]
            };
            w.add_tensor(name, &dims, ty, bytes);
            crate::Result::Ok(())
        };
        let (d, qw, kvw) = (
            self.d_model,
            self.n_head * head_dim,
            self.n_kv_head * head_dim,
        );
        let f32t = GgmlType::F32;
        tensor(
            &mut w,
            "token_embd.weight",
            n_vocab,
            d,
            self.embd_type,
            0.0,
            1.0,
        )?;
        for l in 0..self.n_layer {
            let n = |t: &str| format!("blk.{l}.{t}.weight");
            let mt = self.matrix_type;
            let proj = 2.0 / (d as f32).sqrt();
            tensor(&mut w, &n("attn_norm"), 1, d, f32t, 1.0, 0.2)?;
            tensor(&mut w, &n("attn_q"), qw, d, mt, 0.0, proj)?;
            tensor(&mut w, &n("attn_k"), kvw, d, mt, 0.0, proj)?;
            tensor(&mut w, &n("attn_v"), kvw, d, mt, 0.0, proj)?;
            tensor(&mut w, &n("attn_output"), d, qw, mt, 0.0, proj)?;
            tensor(&mut w, &n("ffn_norm"), 1, d, f32t, 1.0, 0.2)?;
            if self.arch == "qwen2" {
                let b = |t: &str| format!("blk.{l}.{t}.bias");
                tensor(&mut w, &b("attn_q"), 1, qw, f32t, 0.0, 0.5)?;
                tensor(&mut w, &b("attn_k"), 1, kvw, f32t, 0.0, 0.5)?;
                tensor(&mut w, &b("attn_v"), 1, kvw, f32t, 0.0, 0.5)?;
            }
            if self.arch == "gemma3" {
                tensor(&mut w, &n("attn_q_norm"), 1, head_dim, f32t, 1.0, 0.2)?;
                tensor(&mut w, &n("attn_k_norm"), 1, head_dim, f32t, 1.0, 0.2)?;
                tensor(&mut w, &n("post_attention_norm"), 1, d, f32t, 1.0, 0.2)?;
                tensor(&mut w, &n("post_ffw_norm"), 1, d, f32t, 1.0, 0.2)?;
            }
            tensor(&mut w, &n("ffn_gate"), self.d_ff, d, mt, 0.0, proj)?;
            tensor(&mut w, &n("ffn_up"), self.d_ff, d, mt, 0.0, proj)?;
            tensor(
                &mut w,
                &n("ffn_down"),
                d,
                self.d_ff,
                mt,
                0.0,
                2.0 / (self.d_ff as f32).sqrt(),
            )?;
        }
        tensor(&mut w, "output_norm.weight", 1, d, f32t, 1.0, 0.2)?;
        Ok(w.to_bytes())
    }
}
