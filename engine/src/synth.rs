//! Tiny seeded models: a complete, valid GGUF file built in memory with random weights — the test fixtures
//! (`SynthModel::default()`, widths of 64) and the models `lockstep synth` writes for the model axis
//! ([`SynthModel::preset`], widths that are multiples of 256 so that every K-quant applies to every weight).
//!
//! The file has the tensor names, shapes and metadata keys llama.cpp's converter writes for the architecture
//! (convert_hf_to_gguf.py and gguf-py/gguf/constants.py; the loaders in src/models/<arch>.cpp), and a real
//! tokenizer block: a byte-level BPE vocabulary of the 256 GPT-2 byte tokens plus a few merges and control
//! tokens (`tokenizer.ggml.model = gpt2`, `tokenizer.ggml.pre = smollm`), so llama.cpp, transformers and
//! lockstep tokenize prompts the same way. Weights are deterministic for a given seed: the same
//! [`SynthModel`] always gives the same bytes.

use crate::gguf::{GgufWriter, MetaValue};
use crate::quant::{quantize_row, GgmlType};

pub mod bert;
pub mod whisper;

/// Shape and types of a synthetic decoder model: `llama` by default, or one of [`SYNTH_ARCHS`] through
/// [`SynthModel::arch`]: `qwen2` (adds Q/K/V biases), `qwen3` (per-head Q/K norms, no biases), `gemma2`
/// (post-attention and post-FFN norms, soft-capping, a sliding window on even layers), `gemma3` (per-head
/// Q/K norms, post-norms, a sliding window), `phi3` (fused `attn_qkv` and gate+up `ffn_up`, a sliding window
/// llama.cpp ignores), `starcoder2` (LayerNorms with biases, biases on every projection, a non-gated GELU
/// FFN), `stablelm` (LayerNorms with biases, Q/K/V biases, partial rotary), `gpt2` (learned absolute
/// positions `position_embd`, no RoPE, fused `attn_qkv` with a bias, biases and LayerNorms as starcoder2,
/// as many KV heads as query heads), `gemma4` (layer 0 sliding-window with heads of `d_model/n_head`, layer 1
/// full attention with heads twice as wide, V = K on it, proportional RoPE through `rope_freqs`, per-head
/// Q/K norms, post-norms, per-layer output scales, final soft-capping); the windows are
/// [`SynthModel::sliding_window`] positions.
#[derive(Clone, Debug)]
pub struct SynthModel {
    /// `general.architecture`, one of [`SYNTH_ARCHS`].
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
    /// `<arch>.attention.sliding_window` of the architectures that have one (`gemma2`, `gemma3`): short, so
    /// that tests cross it.
    pub sliding_window: u32,
    /// Residual dimensions with large activations, as real models have (Dettmers et al. 2022,
    /// "LLM.int8()"; Sun et al. 2024, "Massive activations"), so that the 8-bit rounding of matmul inputs
    /// matters: the `ffn_down` rows that write them are scaled by [`OUTLIER_SCALE`]. Drawn from the seed.
    pub outliers: usize,
    /// `token_embd` entries are U(−embd_scale, embd_scale) (it is also the tied output head, so this sets
    /// the logits' spread).
    pub embd_scale: f32,
    /// Whether the file has its own `output.weight` (else the head is tied to `token_embd`).
    pub untied_output: bool,
}

/// The architectures [`SynthModel`] writes.
pub const SYNTH_ARCHS: &[&str] = &[
    "llama",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "gemma4",
    "starcoder2",
    "stablelm",
    "phi3",
    "gpt2",
    "bert",
];

/// `stablelm.rope.dimension_count` of a synthetic `stablelm` file, as a fraction of head_dim (StableLM's
/// `partial_rotary_factor` 0.25: 16 of 64).
pub const SYNTH_PARTIAL_ROTARY: usize = 4;

/// Whether `arch` is one of the LayerNorm architectures (`starcoder2`, `stablelm`, `gpt2`).
fn layer_norm_arch(arch: &str) -> bool {
    matches!(arch, "starcoder2" | "stablelm" | "gpt2")
}

/// Whether `arch` has biases on every projection and a non-gated GELU FFN (`starcoder2`, `gpt2`).
fn biased_gelu_arch(arch: &str) -> bool {
    matches!(arch, "starcoder2" | "gpt2")
}

/// `gemma2.attn_logit_softcapping` of a synthetic `gemma2` file: 5, not the real models' 50, so that the
/// tanh is in its curved range for these small attention scores (|q·k|/√d of a few units).
pub const SYNTH_ATTN_SOFTCAP: f32 = 5.0;

/// `<arch>.final_logit_softcapping` of a synthetic `gemma2` and `gemma4` file: 10, not the real models' 30,
/// for the reason [`SYNTH_ATTN_SOFTCAP`] is 5. With the post-norm gain of [`gemma_post_norm_gain`] these
/// models' logits spread over a few units, as the llama-family files' do (|logit| <= ~10), where a cap of 30
/// would bend them by ~3% at most; at 10 the tanh is in its curved range for the top logits (synth-gemma2:
/// max |lm_head| 9.91 -> 7.58, the logits moved by NMSE 4.1e-3). Until issue 42 the cap was 30, when these
/// logits reached 23-30 (see [`gemma_post_norm_gain`]).
pub const SYNTH_FINAL_SOFTCAP: f32 = 10.0;

/// Gain of the Gemma post-norms (`post_attention_norm`, `post_ffw_norm`; gemma2, gemma3, gemma4) of a
/// synthetic file: their weights are `gain * (1 + U(-0.2, 0.2))`, with gain 2·√d_model (32 for the
/// [`SynthModel::preset`] models), where every other norm weight is `1 + U(-0.2, 0.2)`.
///
/// Why (issue 42): Gemma multiplies the token embedding by √d_model on its way into the residual stream
/// (`Gemma*TextScaledWordEmbedding`; llama.cpp's `inp_scaled`), and the output head is tied to that same
/// (unscaled) embedding. With unit post-norms each of the 2·n_layer blocks adds a post-normed vector of norm
/// ~√d to the residual stream, while the scaled embedding has norm √d·|e| ≈ 37 (entries ±0.25): the token's own
/// embedding stayed the dominant direction of the final hidden state (cosine ~0.8 with it), so the tied head
/// gave the CURRENT token a logit of 20-30 against ~6 for the best other one. Every position predicted its
/// input token (11 of 11 prompt positions, p(top-1) ~1.0, margins 12-23 logits) and the greedy continuation
/// repeated the prompt's last token 8 times: KL carried no signal. A trained Gemma's blocks write far more
/// into the residual stream than its embedding does. The √d in the gain cancels the embedding's √d (the
/// embedding then has the share of the residual stream it has in the llama-family files, which add it
/// unscaled); the 2 halves that share again, because at √d what is left of the copy (the tied head reading
/// the token's own embedding: ~1.2 standard deviations of the logits) still locked synth-gemma2's greedy
/// continuation onto one token (the same token predicted at all 8 decode steps); at 2·√d it is ~0.6 of one.
/// Every RMSNorm that reads the residual stream is scale-invariant, so nothing else moves: this is the same
/// model as `token_embd / (2√d)` with an output norm × 2√d. Measured on the llama.cpp goldens of the three
/// F32 files (the full logits rows at the last prompt position and the 8 decode steps; margins = top-1 minus
/// top-2 logit), before -> after: p(top-1) median 1.000 -> 0.15 (gemma2), 0.18 (gemma3), 0.16 (gemma4), at most
/// 0.41; margins 12.5-23.6 -> medians 0.30-0.42, at most 2.3; entropy ~0 -> 3.6-3.7 nats (synth-llama: p(top-1)
/// 0.21, margin 0.24, 3.1 nats); top-1 = the input token at 11/11 -> 0/11 prompt positions; the greedy
/// continuation 8 × the same token -> 5, 7 and 8 distinct tokens in 8 steps. The sliding window (4, crossed by
/// the 11-token prompt) and the soft-caps act as before (attention cap 5 on the same attention scores: the
/// attention path reads the residual stream through RMSNorms only).
pub fn gemma_post_norm_gain(d_model: usize) -> f32 {
    2.0 * (d_model as f32).sqrt()
}

/// `<arch>.context_length` of the synthetic files (also the rows of GPT-2's `position_embd`).
pub const SYNTH_CONTEXT: usize = 256;

/// Head width of a synthetic `gemma4` file's full-attention layers, in multiples of its sliding-window
/// layers' (Gemma 4 31B: 512 and 256).
pub const GEMMA4_FULL_HEAD_FACTOR: usize = 2;

/// Whether layer `l` of a synthetic `gemma4` file is a sliding-window layer (even layers; the odd ones
/// attend to everything).
pub fn gemma4_is_swa(l: usize) -> bool {
    l.is_multiple_of(2)
}

/// Multiplier of the `ffn_down` rows of the [`SynthModel::outliers`] dimensions.
pub const OUTLIER_SCALE: f32 = 8.0;

impl Default for SynthModel {
    fn default() -> Self {
        SynthModel {
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
            sliding_window: TINY_GEMMA3_WINDOW,
            outliers: 0,
            embd_scale: 1.0,
            untied_output: false,
        }
    }
}

/// Sliding window of the test fixture's `gemma3` file (`SynthModel::default()`).
pub const TINY_GEMMA3_WINDOW: u32 = 3;

/// Sliding window of the [`SynthModel::preset`] models: an 8-token prompt crosses it.
pub const SYNTH_WINDOW: u32 = 4;

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

impl SynthModel {
    /// The model `lockstep synth --arch ARCH --seed N` writes: 2 blocks, d_model 256, 4 query heads and 2 KV
    /// heads of 64, d_ff 512, every weight F32 (quantization variants are made from it), RMSNorm ε 1e-6, a
    /// sliding window of [`SYNTH_WINDOW`], two outlier dimensions, `token_embd` in ±0.25 (tied logits with a
    /// spread of a few units, as trained models have), and an untied output head for the Qwen and Phi-3
    /// architectures (their converter writes `output.weight`).
    ///
    /// Errors: an architecture outside [`SYNTH_ARCHS`] (the known ones listed).
    pub fn preset(arch: &str, seed: u64) -> crate::Result<SynthModel> {
        let Some(&arch) = SYNTH_ARCHS.iter().find(|&&a| a == arch) else {
            return Err(crate::Error::Unsupported(format!(
                "synth: architecture {arch:?} is not one lockstep can write (known: {})",
                SYNTH_ARCHS.join(", ")
            )));
        };
        Ok(SynthModel {
            arch,
            n_layer: 2,
            d_model: 256,
            n_head: 4,
            // GPT-2 and BERT have no grouped-query attention (transformers' GPT2Attention and BertSelfAttention
            // have one head count; llama.cpp's converters write no head_count_kv)
            n_kv_head: if matches!(arch, "gpt2" | "bert") {
                4
            } else {
                2
            },
            d_ff: 512,
            matrix_type: GgmlType::F32,
            embd_type: GgmlType::F32,
            norm_eps: 1e-6,
            seed,
            sliding_window: SYNTH_WINDOW,
            outliers: 2,
            embd_scale: 0.25,
            untied_output: matches!(arch, "qwen2" | "qwen3" | "phi3" | "stablelm"),
        })
    }

    /// Vocabulary: 3 control tokens, 256 byte tokens, then one token per merge.
    pub fn vocab(&self) -> Vec<String> {
        let mut v: Vec<String> = TINY_SPECIALS.iter().map(|s| s.to_string()).collect();
        v.extend(byte_chars().into_iter().map(String::from));
        v.extend(TINY_MERGES.iter().map(|m| m.replace(' ', "")));
        v
    }

    /// Build the GGUF file bytes.
    ///
    /// Errors: a matrix type whose quantizer the engine lacks, widths that are not whole blocks, a `gpt2`
    /// model with fewer KV heads than query heads.
    pub fn build(&self) -> crate::Result<Vec<u8>> {
        if self.arch == "gpt2" && self.n_kv_head != self.n_head {
            // the file has no head_count_kv key (GPT2Model.set_gguf_parameters writes none)
            return Err(crate::Error::Unsupported(format!(
                "synth: gpt2 has no grouped-query attention; n_kv_head {} must equal n_head {}",
                self.n_kv_head, self.n_head
            )));
        }
        if self.arch == "bert" {
            // an encoder: its own tensors, metadata and WordPiece vocabulary (synth/bert.rs)
            return bert::build_bert(self);
        }
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
        // llama.cpp sets per-token attributes by the model name: one containing "phi3" or "phi-3" has them
        // set on Phi-3's SPM tokens (`</s>`, `<unk>`, `<s>`: llama-vocab.cpp `_set_token_attr`), which this
        // byte-level vocabulary lacks (the load fails), so the phi3 file is named without them
        let name = match a {
            "phi3" => "tiny-phi (synthetic)".to_string(),
            _ => format!("tiny-{a} (synthetic)"),
        };
        w.add_metadata("general.name", s(&name));
        w.add_metadata(&key("block_count"), u(self.n_layer as u32));
        w.add_metadata(&key("context_length"), u(SYNTH_CONTEXT as u32));
        w.add_metadata(&key("embedding_length"), u(self.d_model as u32));
        w.add_metadata(&key("feed_forward_length"), u(self.d_ff as u32));
        w.add_metadata(&key("attention.head_count"), u(self.n_head as u32));
        if a != "gpt2" {
            // GPT2Model.set_gguf_parameters writes neither (no GQA, no RoPE)
            w.add_metadata(&key("attention.head_count_kv"), u(self.n_kv_head as u32));
            w.add_metadata(&key("rope.freq_base"), MetaValue::F32(10000.0));
            let rope_dim = match a {
                "stablelm" => head_dim / SYNTH_PARTIAL_ROTARY,
                "gemma4" => GEMMA4_FULL_HEAD_FACTOR * head_dim,
                _ => head_dim,
            };
            w.add_metadata(&key("rope.dimension_count"), u(rope_dim as u32));
        }
        let eps_key = if layer_norm_arch(a) {
            "attention.layer_norm_epsilon"
        } else {
            "attention.layer_norm_rms_epsilon"
        };
        w.add_metadata(&key(eps_key), MetaValue::F32(self.norm_eps));
        if matches!(a, "qwen3" | "gemma2" | "gemma3") {
            w.add_metadata(&key("attention.key_length"), u(head_dim as u32));
            w.add_metadata(&key("attention.value_length"), u(head_dim as u32));
        }
        if a == "gemma4" {
            // Gemma4Model.set_gguf_parameters: full-attention heads (key_length, rope.dimension_count: the
            // whole head, "proportional" RoPE through rope_freqs) and sliding-window heads (_swa)
            let full = GEMMA4_FULL_HEAD_FACTOR * head_dim;
            for k in ["attention.key_length", "attention.value_length"] {
                w.add_metadata(&key(k), u(full as u32));
                w.add_metadata(&key(&format!("{k}_swa")), u(head_dim as u32));
            }
            w.add_metadata(&key("rope.dimension_count_swa"), u(head_dim as u32));
            w.add_metadata(&key("rope.freq_base_swa"), MetaValue::F32(10000.0));
            let pattern = (0..self.n_layer)
                .map(|l| MetaValue::Bool(gemma4_is_swa(l)))
                .collect();
            w.add_metadata(
                &key("attention.sliding_window_pattern"),
                MetaValue::Array(pattern),
            );
            w.add_metadata(&key("attention.shared_kv_layers"), u(0));
            w.add_metadata(&key("embedding_length_per_layer_input"), u(0));
            w.add_metadata(
                &key("final_logit_softcapping"),
                MetaValue::F32(SYNTH_FINAL_SOFTCAP),
            );
        }
        if matches!(a, "gemma2" | "gemma3" | "gemma4" | "phi3") {
            w.add_metadata(&key("attention.sliding_window"), u(self.sliding_window));
        }
        if a == "phi3" {
            // Phi3MiniModel.set_gguf_parameters (the original_max_position_embeddings)
            w.add_metadata(&key("rope.scaling.original_context_length"), u(256));
        }
        if a == "gemma2" {
            let f = MetaValue::F32;
            w.add_metadata(&key("attn_logit_softcapping"), f(SYNTH_ATTN_SOFTCAP));
            w.add_metadata(&key("final_logit_softcapping"), f(SYNTH_FINAL_SOFTCAP));
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

        // the residual dimensions that carry large activations (drawn first; none for the fixtures)
        let d = self.d_model;
        let outliers = self.outlier_columns(&mut rng);

        // A [rows, cols] tensor of offset + U(-scale, scale), quantized row by row; 1-D when rows == 1.
        // The rows of `ffn_down` that write the outlier dimensions are scaled by OUTLIER_SCALE.
        let mut tensor = |w: &mut GgufWriter,
                          name: &str,
                          rows: usize,
                          cols: usize,
                          ty: GgmlType,
                          offset: f32,
                          scale: f32| {
            let mut vals: Vec<f32> = (0..rows * cols)
                .map(|_| offset + rng.next() * scale)
                .collect();
            if name.ends_with("ffn_down.weight") {
                for &r in &outliers {
                    vals[r * cols..][..cols]
                        .iter_mut()
                        .for_each(|v| *v *= OUTLIER_SCALE);
                }
            }
            if rows > 1 {
                return add_matrix(w, name, &vals, cols, ty);
            }
            w.add_tensor(name, &[cols as u64], ty, quantize_row(ty, &vals)?);
            crate::Result::Ok(())
        };
        let (qw, kvw) = (self.n_head * head_dim, self.n_kv_head * head_dim);
        let f32t = GgmlType::F32;
        let embd = (n_vocab, d, self.embd_type);
        tensor(
            &mut w,
            "token_embd.weight",
            embd.0,
            embd.1,
            embd.2,
            0.0,
            self.embd_scale,
        )?;

        if self.arch == "gpt2" {
            // learned absolute positions, one row per position of the context (GPT-2's `wpe`)
            tensor(
                &mut w,
                "position_embd.weight",
                SYNTH_CONTEXT,
                d,
                self.embd_type,
                0.0,
                self.embd_scale,
            )?;
        }

        if self.arch == "gemma4" {
            // the full-attention layers' "proportional" RoPE (Gemma4Model.generate_extra_tensors): a quarter
            // of the pairs turn (factor 1), the rest are held still (factor 1e30)
            let pairs = GEMMA4_FULL_HEAD_FACTOR * head_dim / 2;
            let turning = pairs / SYNTH_PARTIAL_ROTARY;
            let ff: Vec<f32> = (0..pairs)
                .map(|i| if i < turning { 1.0 } else { 1e30 })
                .collect();
            w.add_tensor(
                "rope_freqs.weight",
                &[pairs as u64],
                f32t,
                quantize_row(f32t, &ff)?,
            );
        }

        // Phi-3's converter writes fused Q/K/V and gate/up matrices (GPT-2's fused Q/K/V: `c_attn`)
        let fused_qkv = matches!(self.arch, "phi3" | "gpt2");
        let fused = self.arch == "phi3";
        for l in 0..self.n_layer {
            let n = |t: &str| format!("blk.{l}.{t}.weight");
            let mt = self.matrix_type;
            // Gemma 4's full-attention layers have wider heads
            let (head_dim, qw, kvw) = match self.arch == "gemma4" && !gemma4_is_swa(l) {
                true => {
                    let f = GEMMA4_FULL_HEAD_FACTOR;
                    (f * head_dim, f * qw, f * kvw)
                }
                false => (head_dim, qw, kvw),
            };
            // and take their values from the key projection (no attn_v: attention_k_eq_v)
            let has_v = self.arch != "gemma4" || gemma4_is_swa(l);
            let proj = 2.0 / (d as f32).sqrt();
            tensor(&mut w, &n("attn_norm"), 1, d, f32t, 1.0, 0.2)?;
            if fused_qkv {
                // Phi-3's qkv_proj, GPT-2's c_attn: [q; k; v] rows in one matrix
                tensor(&mut w, &n("attn_qkv"), qw + 2 * kvw, d, mt, 0.0, proj)?;
            } else {
                tensor(&mut w, &n("attn_q"), qw, d, mt, 0.0, proj)?;
                tensor(&mut w, &n("attn_k"), kvw, d, mt, 0.0, proj)?;
                if has_v {
                    tensor(&mut w, &n("attn_v"), kvw, d, mt, 0.0, proj)?;
                }
            }
            tensor(&mut w, &n("attn_output"), d, qw, mt, 0.0, proj)?;
            tensor(&mut w, &n("ffn_norm"), 1, d, f32t, 1.0, 0.2)?;
            let b = |t: &str| format!("blk.{l}.{t}.bias");
            if layer_norm_arch(self.arch) {
                // LayerNorm biases (starcoder2, stablelm), and starcoder2's output-projection and FFN biases
                tensor(&mut w, &b("attn_norm"), 1, d, f32t, 0.0, 0.2)?;
                tensor(&mut w, &b("ffn_norm"), 1, d, f32t, 0.0, 0.2)?;
                if fused_qkv {
                    tensor(&mut w, &b("attn_qkv"), 1, qw + 2 * kvw, f32t, 0.0, 0.5)?;
                } else {
                    tensor(&mut w, &b("attn_q"), 1, qw, f32t, 0.0, 0.5)?;
                    tensor(&mut w, &b("attn_k"), 1, kvw, f32t, 0.0, 0.5)?;
                    tensor(&mut w, &b("attn_v"), 1, kvw, f32t, 0.0, 0.5)?;
                }
                if biased_gelu_arch(self.arch) {
                    tensor(&mut w, &b("attn_output"), 1, d, f32t, 0.0, 0.2)?;
                    tensor(&mut w, &b("ffn_up"), 1, self.d_ff, f32t, 0.0, 0.5)?;
                    tensor(&mut w, &b("ffn_down"), 1, d, f32t, 0.0, 0.2)?;
                }
            }
            if self.arch == "qwen2" {
                tensor(&mut w, &b("attn_q"), 1, qw, f32t, 0.0, 0.5)?;
                tensor(&mut w, &b("attn_k"), 1, kvw, f32t, 0.0, 0.5)?;
                tensor(&mut w, &b("attn_v"), 1, kvw, f32t, 0.0, 0.5)?;
            }
            if matches!(self.arch, "qwen3" | "gemma3" | "gemma4") {
                tensor(&mut w, &n("attn_q_norm"), 1, head_dim, f32t, 1.0, 0.2)?;
                tensor(&mut w, &n("attn_k_norm"), 1, head_dim, f32t, 1.0, 0.2)?;
            }
            if matches!(self.arch, "gemma2" | "gemma3" | "gemma4") {
                // 2√d_model gain: the residual stream must not be the (√d-scaled, tied) token embedding
                let g = gemma_post_norm_gain(d);
                tensor(&mut w, &n("post_attention_norm"), 1, d, f32t, g, 0.2 * g)?;
                tensor(&mut w, &n("post_ffw_norm"), 1, d, f32t, g, 0.2 * g)?;
            }
            if self.arch == "gemma4" {
                // Gemma 4's layer_scalar
                tensor(&mut w, &n("layer_output_scale"), 1, 1, f32t, 0.8, 0.2)?;
            }
            if fused {
                // Phi-3's gate_up_proj: gate rows, then up rows
                tensor(&mut w, &n("ffn_up"), 2 * self.d_ff, d, mt, 0.0, proj)?;
            } else {
                if !biased_gelu_arch(self.arch) {
                    tensor(&mut w, &n("ffn_gate"), self.d_ff, d, mt, 0.0, proj)?;
                }
                tensor(&mut w, &n("ffn_up"), self.d_ff, d, mt, 0.0, proj)?;
            }
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
        if layer_norm_arch(self.arch) {
            tensor(&mut w, "output_norm.bias", 1, d, f32t, 0.0, 0.2)?;
        }
        if self.untied_output {
            let proj = 2.0 / (d as f32).sqrt();
            tensor(
                &mut w,
                "output.weight",
                n_vocab,
                d,
                self.embd_type,
                0.0,
                proj,
            )?;
        }
        Ok(w.to_bytes())
    }

    /// [`SynthModel::outliers`] distinct dimensions in `0..d_model`, drawn from the weight stream (none drawn
    /// when there are none, so fixtures without outliers keep their bytes).
    fn outlier_columns(&self, rng: &mut Rng) -> Vec<usize> {
        let mut cols = Vec::with_capacity(self.outliers);
        while cols.len() < self.outliers.min(self.d_model) {
            let c =
                (((rng.next() + 1.0) * 0.5 * self.d_model as f32) as usize).min(self.d_model - 1);
            if !cols.contains(&c) {
                cols.push(c);
            }
        }
        cols
    }
}

/// Quantize the `[rows, cols]` matrix `vals` row by row into `ty` and add it as tensor `name`.
fn add_matrix(
    w: &mut GgufWriter,
    name: &str,
    vals: &[f32],
    cols: usize,
    ty: GgmlType,
) -> crate::Result<()> {
    let mut bytes = Vec::new();
    for row in vals.chunks_exact(cols) {
        bytes.extend(quantize_row(ty, row)?);
    }
    let dims = [cols as u64, (vals.len() / cols) as u64];
    w.add_tensor(name, &dims, ty, bytes);
    Ok(())
}
