//! The seeded Whisper (`lockstep synth --arch whisper`, issue 44): the tiny `WhisperForConditionalGeneration`
//! checkpoint of oracles/whisper/make_checkpoint.py (the dimensions of [`WHISPER_DIMS`], the same
//! `config.json`, tensor names and shapes, tokenizer vocabulary and `preprocessor_config.json`), with
//! weights drawn from lockstep's own seeded generator (the one [`super::SynthModel`] uses) instead of torch's.
//! Whisper has no GGUF form here: this is a Hugging Face checkpoint directory, which the engine loads
//! ([`crate::hf::open_dir`], layout `whisper` of [`crate::hf::layout`]).
//!
//! Weights, in the Python maker's distributions, one draw per parameter in name order (as its
//! `init_weights` walks `sorted(model.named_parameters())`): matrices and convolution kernels
//! N(0, 1/fan_in) (fan_in = `shape[1]`, times the kernel width for a convolution), biases N(0, 0.1²),
//! LayerNorm weights 1 + N(0, 0.1²), the token embedding (tied to the output head, so not stored twice)
//! N(0, 0.5²), the decoder positions N(0, 2²); the encoder's `embed_positions` are transformers'
//! sinusoids ([`sinusoids`]). The normal draws are Box–Muller over the generator's uniforms, computed in
//! f64 and rounded to f32 once.

use serde_json::{json, Value};

use super::{byte_chars, Rng, TINY_MERGES};
use crate::gguf::{GgufFile, GgufWriter, MetaValue};

/// Whisper's control tokens, ids 0..5, in the Python maker's order (make_checkpoint.py `SPECIALS`).
pub const WHISPER_SPECIALS: [&str; 6] = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|en|>",
    "<|transcribe|>",
    "<|translate|>",
    "<|notimestamps|>",
];

/// Merges after [`TINY_MERGES`] (byte-level form): the porter's vocabulary
/// (oracles/porter/make_checkpoint.py `MERGES`), which the Python Whisper maker reuses.
pub const WHISPER_EXTRA_MERGES: [&str; 4] = ["Ġt he", "i n", "e r", "o n"];

/// Shape of the seeded Whisper (make_checkpoint.py `CONFIG`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WhisperDims {
    /// `d_model`: the residual width of both stacks.
    pub d_model: usize,
    /// `encoder_layers`.
    pub encoder_layers: usize,
    /// `decoder_layers`.
    pub decoder_layers: usize,
    /// `encoder_attention_heads` = `decoder_attention_heads`.
    pub heads: usize,
    /// `encoder_ffn_dim` = `decoder_ffn_dim`.
    pub ffn: usize,
    /// `num_mel_bins`.
    pub n_mels: usize,
    /// `max_source_positions`: encoder positions (1 s of audio = 100 mel frames, halved by conv2).
    pub source_positions: usize,
    /// `max_target_positions`: decoder positions.
    pub target_positions: usize,
}

/// The seeded Whisper's dimensions: d_model 64, 2 + 2 layers, 4 heads, FFN 128, 80 mels, 50 source and 64
/// target positions.
pub const WHISPER_DIMS: WhisperDims = WhisperDims {
    d_model: 64,
    encoder_layers: 2,
    decoder_layers: 2,
    heads: 4,
    ffn: 128,
    n_mels: 80,
    source_positions: 50,
    target_positions: 64,
};

/// Standard deviation of the token embedding (make_checkpoint.py `EMBED_STD`).
pub const WHISPER_EMBED_STD: f64 = 0.5;
/// Standard deviation of the decoder positions (make_checkpoint.py `POS_STD`).
pub const WHISPER_POS_STD: f64 = 2.0;
/// Standard deviation of every bias and of the LayerNorm weights around 1.
pub const WHISPER_SMALL_STD: f64 = 0.1;

/// The merges of the seeded Whisper's BPE: [`TINY_MERGES`] then [`WHISPER_EXTRA_MERGES`].
pub fn whisper_merges() -> Vec<String> {
    TINY_MERGES
        .iter()
        .chain(WHISPER_EXTRA_MERGES.iter())
        .map(|m| m.to_string())
        .collect()
}

/// The seeded Whisper's vocabulary (270 tokens): [`WHISPER_SPECIALS`], the 256 GPT-2 byte tokens in byte
/// order, then one token per merge of [`whisper_merges`].
pub fn whisper_vocab() -> Vec<String> {
    let mut v: Vec<String> = WHISPER_SPECIALS.iter().map(|s| s.to_string()).collect();
    v.extend(byte_chars().into_iter().map(String::from));
    v.extend(whisper_merges().iter().map(|m| m.replace(' ', "")));
    v
}

/// Transformers' sinusoidal encoder positions, `[length, channels]` row-major: row `t` is
/// `sin(t·inv_0..), cos(t·inv_0..)` with `inv_i = exp(-i·ln(10000)/(channels/2 − 1))`
/// (transformers `models/whisper/modeling_whisper.py` `sinusoids`, which
/// `WhisperPreTrainedModel._init_weights` copies into `embed_positions`), in f32 as torch computes it:
/// the increment a double, `inv_i` = `expf(f32(−inc)·i)`, `t·inv_i` an f32 product, then `sinf`/`cosf`.
/// Torch's vectorized exp/sin/cos are within an ulp of correctly rounded, Rust's f32 ones are correctly
/// rounded here, so an entry may differ from torch's by one ulp (50 × 64: 151 of 3200 entries, at most 6e-8).
///
/// `channels` must be even and at least 4 (the Python function refuses odd ones; 2 divides by zero).
pub fn sinusoids(length: usize, channels: usize) -> Vec<f32> {
    let half = channels / 2;
    let inc = (10000f64).ln() / (half as f64 - 1.0);
    let inv: Vec<f32> = (0..half)
        .map(|i| ((-inc) as f32 * i as f32).exp())
        .collect();
    let mut out = Vec::with_capacity(length * channels);
    for t in 0..length {
        let st: Vec<f32> = inv.iter().map(|&v| t as f32 * v).collect();
        out.extend(st.iter().map(|x| x.sin()));
        out.extend(st.iter().map(|x| x.cos()));
    }
    out
}

/// One tensor of the seeded Whisper: HF name, PyTorch shape, f32 values row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct WhisperTensor {
    /// HF name (`model.encoder.conv1.weight`).
    pub name: String,
    /// PyTorch shape (`[64, 80, 3]` for conv1: out, in, kernel).
    pub shape: Vec<usize>,
    /// `shape.product()` values, row-major.
    pub values: Vec<f32>,
}

/// Names and shapes of every stored tensor of a Whisper of dimensions `d` with a vocabulary of `n_vocab`,
/// sorted by name (the output head `proj_out` is tied to `model.decoder.embed_tokens` and not stored, as
/// `save_pretrained` writes it).
pub fn whisper_shapes(d: &WhisperDims, n_vocab: usize) -> Vec<(String, Vec<usize>)> {
    let m = d.d_model;
    let mut v: Vec<(String, Vec<usize>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>| v.push((name, shape));
    let ln = |add: &mut dyn FnMut(String, Vec<usize>), p: &str| {
        add(format!("{p}.weight"), vec![m]);
        add(format!("{p}.bias"), vec![m]);
    };
    let attn = |add: &mut dyn FnMut(String, Vec<usize>), p: &str| {
        for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            add(format!("{p}.{proj}.weight"), vec![m, m]);
            if proj != "k_proj" {
                add(format!("{p}.{proj}.bias"), vec![m]);
            }
        }
    };
    let ffn = |add: &mut dyn FnMut(String, Vec<usize>), p: &str| {
        add(format!("{p}.fc1.weight"), vec![d.ffn, m]);
        add(format!("{p}.fc1.bias"), vec![d.ffn]);
        add(format!("{p}.fc2.weight"), vec![m, d.ffn]);
        add(format!("{p}.fc2.bias"), vec![m]);
    };
    add("model.encoder.conv1.weight".into(), vec![m, d.n_mels, 3]);
    add("model.encoder.conv1.bias".into(), vec![m]);
    add("model.encoder.conv2.weight".into(), vec![m, m, 3]);
    add("model.encoder.conv2.bias".into(), vec![m]);
    add(
        "model.encoder.embed_positions.weight".into(),
        vec![d.source_positions, m],
    );
    ln(&mut add, "model.encoder.layer_norm");
    for l in 0..d.encoder_layers {
        let p = format!("model.encoder.layers.{l}");
        attn(&mut add, &format!("{p}.self_attn"));
        ln(&mut add, &format!("{p}.self_attn_layer_norm"));
        ffn(&mut add, &p);
        ln(&mut add, &format!("{p}.final_layer_norm"));
    }
    add("model.decoder.embed_tokens.weight".into(), vec![n_vocab, m]);
    add(
        "model.decoder.embed_positions.weight".into(),
        vec![d.target_positions, m],
    );
    ln(&mut add, "model.decoder.layer_norm");
    for l in 0..d.decoder_layers {
        let p = format!("model.decoder.layers.{l}");
        attn(&mut add, &format!("{p}.self_attn"));
        ln(&mut add, &format!("{p}.self_attn_layer_norm"));
        attn(&mut add, &format!("{p}.encoder_attn"));
        ln(&mut add, &format!("{p}.encoder_attn_layer_norm"));
        ffn(&mut add, &p);
        ln(&mut add, &format!("{p}.final_layer_norm"));
    }
    v.sort();
    v
}

/// A standard normal draw: Box–Muller over two uniforms of `rng` (each `k/2^24`, so `1 − u` is in (0, 1]),
/// in f64.
fn normal(rng: &mut Rng) -> f64 {
    let u1 = 1.0 - (rng.next() as f64 + 1.0) / 2.0;
    let u2 = (rng.next() as f64 + 1.0) / 2.0;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Every stored tensor of the seeded Whisper `seed` ([`WHISPER_DIMS`], [`whisper_vocab`]), sorted by name,
/// drawn as the module documentation says: one generator (seeded as [`super::SynthModel`]'s), the tensors
/// in name order, each filled row-major before the next; `model.encoder.embed_positions.weight` is
/// [`sinusoids`] and draws nothing.
pub fn whisper_tensors(seed: u64) -> Vec<WhisperTensor> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let d = WHISPER_DIMS;
    whisper_shapes(&d, whisper_vocab().len())
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let values = if name == "model.encoder.embed_positions.weight" {
                sinusoids(shape[0], shape[1])
            } else {
                let (offset, scale) = if name.contains("layer_norm") && name.ends_with(".weight") {
                    (1.0, WHISPER_SMALL_STD)
                } else if name.ends_with(".bias") {
                    (0.0, WHISPER_SMALL_STD)
                } else if name == "model.decoder.embed_tokens.weight" {
                    (0.0, WHISPER_EMBED_STD)
                } else if name == "model.decoder.embed_positions.weight" {
                    (0.0, WHISPER_POS_STD)
                } else {
                    // a matrix or a convolution kernel: N(0, 1/fan_in)
                    let fan_in = shape[1] * shape.get(2).copied().unwrap_or(1);
                    (0.0, 1.0 / (fan_in as f64).sqrt())
                };
                (0..n)
                    .map(|_| (offset + scale * normal(&mut rng)) as f32)
                    .collect()
            };
            WhisperTensor {
                name,
                shape,
                values,
            }
        })
        .collect()
}

/// The seeded Whisper's `config.json`: the keys and values transformers 5.23's `WhisperConfig.to_dict`
/// writes for make_checkpoint.py's `CONFIG` (the checkpoint oracles/whisper/checkpoints/whisper-seeded
/// has: no dropout, no SpecAugment, `<|endoftext|>` = bos = eos = pad, `<|startoftranscript|>` the decoder
/// start, no suppressed tokens, tied output head).
pub fn whisper_config() -> Value {
    let d = WHISPER_DIMS;
    // two objects: one json! of 43 keys passes the macro's recursion limit
    let mut cfg = json!({
        "activation_dropout": 0.0,
        "activation_function": "gelu",
        "apply_spec_augment": false,
        "architectures": ["WhisperForConditionalGeneration"],
        "attention_dropout": 0.0,
        "begin_suppress_tokens": null,
        "bos_token_id": 0,
        "classifier_proj_size": 256,
        "d_model": d.d_model,
        "decoder_attention_heads": d.heads,
        "decoder_ffn_dim": d.ffn,
        "decoder_layerdrop": 0.0,
        "decoder_layers": d.decoder_layers,
        "decoder_start_token_id": 1,
        "dropout": 0.0,
        "dtype": "float32",
        "encoder_attention_heads": d.heads,
        "encoder_ffn_dim": d.ffn,
        "encoder_layerdrop": 0.0,
        "encoder_layers": d.encoder_layers,
        "eos_token_id": 0,
        "init_std": 0.02,
        "is_encoder_decoder": true,
    });
    let rest = json!({
        "mask_feature_length": 10,
        "mask_feature_min_masks": 0,
        "mask_feature_prob": 0.0,
        "mask_time_length": 10,
        "mask_time_min_masks": 2,
        "mask_time_prob": 0.05,
        "max_source_positions": d.source_positions,
        "max_target_positions": d.target_positions,
        "median_filter_width": 7,
        "model_type": "whisper",
        "num_mel_bins": d.n_mels,
        "pad_token_id": 0,
        "scale_embedding": false,
        "suppress_tokens": null,
        "tie_word_embeddings": true,
        "transformers_version": "5.23.0",
        "use_cache": true,
        "use_weighted_layer_sum": false,
        "vocab_size": whisper_vocab().len(),
    });
    if let (Some(a), Value::Object(b)) = (cfg.as_object_mut(), rest) {
        a.extend(b);
    }
    cfg
}

/// The seeded Whisper's `preprocessor_config.json`: transformers' `WhisperFeatureExtractor(feature_size=80,
/// sampling_rate=16000, hop_length=160, chunk_length=1, n_fft=400)` as `save_pretrained` writes it.
pub fn whisper_preprocessor_config() -> Value {
    json!({
        "chunk_length": 1,
        "dither": 0.0,
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": WHISPER_DIMS.n_mels,
        "hop_length": 160,
        "n_fft": 400,
        "n_samples": 16000,
        "nb_max_frames": 100,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": false,
        "sampling_rate": 16000
    })
}

/// The seeded Whisper's `tokenizer.json`: [`whisper_vocab`] and [`whisper_merges`] as a GGUF tokenizer
/// block (`gpt2` model, `gpt-2` pre-tokenizer = the GPT-2 regex the Python maker's `ByteLevel(use_regex)`
/// applies, the six control tokens of type control, `<|endoftext|>` bos/eos, no bos added) turned into
/// `tokenizer.json` by the writer `lockstep export-hf` uses ([`crate::hf::tokenizer_json::from_gguf`]).
///
/// Errors: as [`crate::hf::tokenizer_json::from_gguf`] (none for this fixed vocabulary).
pub fn whisper_tokenizer_json() -> crate::Result<Value> {
    let vocab = whisper_vocab();
    let s = |x: &str| MetaValue::String(x.to_string());
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", s("whisper"));
    w.add_metadata("tokenizer.ggml.model", s("gpt2"));
    w.add_metadata("tokenizer.ggml.pre", s("gpt-2"));
    w.add_metadata(
        "tokenizer.ggml.tokens",
        MetaValue::Array(vocab.iter().map(|t| s(t)).collect()),
    );
    let types = (0..vocab.len())
        .map(|i| MetaValue::I32(if i < WHISPER_SPECIALS.len() { 3 } else { 1 }))
        .collect();
    w.add_metadata("tokenizer.ggml.token_type", MetaValue::Array(types));
    w.add_metadata(
        "tokenizer.ggml.merges",
        MetaValue::Array(whisper_merges().iter().map(|m| s(m)).collect()),
    );
    w.add_metadata("tokenizer.ggml.bos_token_id", MetaValue::U32(0));
    w.add_metadata("tokenizer.ggml.eos_token_id", MetaValue::U32(0));
    w.add_metadata("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    let g = GgufFile::from_bytes(w.to_bytes(), "<seeded whisper tokenizer>")?;
    let (tok, _config) = crate::hf::tokenizer_json::from_gguf(&g)?;
    Ok(tok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_have_the_maker_scales_and_the_seed_matters() {
        let t = whisper_tensors(1);
        let std = |name: &str, offset: f64| {
            let v = &t.iter().find(|x| x.name == name).unwrap().values;
            let n = v.len() as f64;
            (v.iter().map(|&x| (x as f64 - offset).powi(2)).sum::<f64>() / n).sqrt()
        };
        let near = |got: f64, want: f64| (got / want - 1.0).abs() < 0.1;
        assert!(near(std("model.decoder.embed_tokens.weight", 0.0), 0.5));
        assert!(near(std("model.decoder.embed_positions.weight", 0.0), 2.0));
        assert!(near(
            std("model.encoder.conv1.weight", 0.0),
            (1.0f64 / 240.0).sqrt()
        ));
        assert!(near(
            std("model.decoder.layers.0.fc2.weight", 0.0),
            (1.0f64 / 128.0).sqrt()
        ));
        assert!(std("model.decoder.layer_norm.weight", 1.0) < 0.15);
        assert_ne!(t, whisper_tensors(2));
        assert_eq!(t, whisper_tensors(1));
    }
}
