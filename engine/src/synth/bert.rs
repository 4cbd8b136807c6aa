//! The seeded `bert` encoder (`lockstep synth --arch bert`): the tensors, metadata and WordPiece vocabulary
//! llama.cpp's converter writes for a `BertModel` (conversion/bert.py `BertModel`, gguf-py/gguf/constants.py
//! `MODEL_ARCH.BERT`; loaded by src/models/bert.cpp), with seeded random weights.
//!
//! - Metadata: `bert.{context_length, embedding_length, feed_forward_length, block_count,
//!   attention.head_count, attention.layer_norm_epsilon}`, `bert.attention.causal = false`,
//!   `bert.pooling_type` ([`SYNTH_BERT_POOLING`], mean), `tokenizer.ggml.token_type_count = 2`.
//! - Tensors: `token_embd`, `token_types` (`[2, d]`), `position_embd` (`[context_length, d]`),
//!   `token_embd_norm.{weight,bias}`; per block `attn_{q,k,v}.{weight,bias}`, `attn_output.{weight,bias}`,
//!   `attn_output_norm.{weight,bias}`, `ffn_up.{weight,bias}`, `ffn_down.{weight,bias}`,
//!   `layer_output_norm.{weight,bias}`. No output norm, no output head: the model ends in its pooled embedding.
//! - Tokenizer: a real WordPiece block (`tokenizer.ggml.model = "bert"`, llama.cpp `LLAMA_VOCAB_TYPE_WPM`) in
//!   the converter's phantom-space form (a word-initial piece `▁the`, a continuation `ll`, control tokens as
//!   they are): [`bert_vocab`]. No normalizer keys: llama.cpp then lowercases (and strips accents), as uncased BERT.
//!
//! [`bert_tensors`] gives the same weights as f32 arrays by GGUF name, for the Hugging Face copy.

use super::{add_matrix, Rng, SynthModel, OUTLIER_SCALE};
use crate::gguf::{GgufWriter, MetaValue};
use crate::quant::{quantize_row, GgmlType};

/// `bert.pooling_type` of the seeded `bert` file: 1 = `LLAMA_POOLING_TYPE_MEAN` (0 none, 2 CLS, 3 last).
pub const SYNTH_BERT_POOLING: u32 = 1;

/// `bert.context_length` of the seeded `bert` file (the rows of `position_embd`).
pub const SYNTH_BERT_CONTEXT: usize = 128;

/// Token types of the seeded `bert` file (`tokenizer.ggml.token_type_count`, the rows of `token_types`;
/// llama.cpp and lockstep use type 0 for every token).
pub const SYNTH_BERT_TOKEN_TYPES: usize = 2;

/// Control tokens of the seeded WordPiece vocabulary, ids 0..5, in BERT's order (`[UNK]` is id 1).
pub const BERT_SPECIALS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];

/// Whole-word and continuation pieces of the seeded vocabulary beyond single characters (phantom-space
/// form): "the hell is here" is `[CLS] ▁the ▁he ll ▁is ▁he re [SEP]`.
pub const BERT_PIECES: [&str; 7] = ["▁the", "▁is", "▁he", "ll", "re", "▁lock", "step"];

/// The seeded WordPiece vocabulary: [`BERT_SPECIALS`], then `▁c` and `c` for every ASCII lowercase letter and
/// digit, `▁p` for ASCII punctuation `.,!?'-:;()`, then [`BERT_PIECES`].
pub fn bert_vocab() -> Vec<String> {
    let mut v: Vec<String> = BERT_SPECIALS.iter().map(|s| s.to_string()).collect();
    let chars: Vec<char> = ('a'..='z').chain('0'..='9').collect();
    v.extend(chars.iter().map(|c| format!("\u{2581}{c}")));
    v.extend(chars.iter().map(|c| c.to_string()));
    v.extend(".,!?'-:;()".chars().map(|c| format!("\u{2581}{c}")));
    v.extend(BERT_PIECES.iter().map(|s| s.to_string()));
    v
}

/// One seeded tensor: GGUF name, ggml dims (`[cols]` or `[cols, rows]`), f32 values row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthTensor {
    /// GGUF tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Rows (1 for a vector).
    pub rows: usize,
    /// Columns (the contiguous dimension).
    pub cols: usize,
    /// `rows · cols` values, row-major.
    pub values: Vec<f32>,
}

/// Every tensor of the seeded `bert` model `m` in file order, as f32 (before any quantization).
pub fn bert_tensors(m: &SynthModel) -> Vec<SynthTensor> {
    let mut rng = Rng(m.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let d = m.d_model;
    let outliers = m.outlier_columns(&mut rng);
    let n_vocab = bert_vocab().len();
    let mut out = Vec::new();
    let mut t = |name: &str, rows: usize, cols: usize, offset: f32, scale: f32| {
        let mut values: Vec<f32> = (0..rows * cols)
            .map(|_| offset + rng.next() * scale)
            .collect();
        if name.ends_with("ffn_down.weight") {
            for &r in &outliers {
                values[r * cols..][..cols]
                    .iter_mut()
                    .for_each(|v| *v *= OUTLIER_SCALE);
            }
        }
        out.push(SynthTensor {
            name: name.to_string(),
            rows,
            cols,
            values,
        });
    };
    t("token_embd.weight", n_vocab, d, 0.0, m.embd_scale);
    t("token_types.weight", SYNTH_BERT_TOKEN_TYPES, d, 0.0, 0.1);
    t("position_embd.weight", SYNTH_BERT_CONTEXT, d, 0.0, 0.1);
    t("token_embd_norm.weight", 1, d, 1.0, 0.2);
    t("token_embd_norm.bias", 1, d, 0.0, 0.2);
    let proj = 2.0 / (d as f32).sqrt();
    for l in 0..m.n_layer {
        let n = |s: &str| format!("blk.{l}.{s}");
        for p in ["attn_q", "attn_k", "attn_v"] {
            t(&n(&format!("{p}.weight")), d, d, 0.0, proj);
            t(&n(&format!("{p}.bias")), 1, d, 0.0, 0.5);
        }
        t(&n("attn_output.weight"), d, d, 0.0, proj);
        t(&n("attn_output.bias"), 1, d, 0.0, 0.2);
        t(&n("attn_output_norm.weight"), 1, d, 1.0, 0.2);
        t(&n("attn_output_norm.bias"), 1, d, 0.0, 0.2);
        t(&n("ffn_up.weight"), m.d_ff, d, 0.0, proj);
        t(&n("ffn_up.bias"), 1, m.d_ff, 0.0, 0.5);
        let down = 2.0 / (m.d_ff as f32).sqrt();
        t(&n("ffn_down.weight"), d, m.d_ff, 0.0, down);
        t(&n("ffn_down.bias"), 1, d, 0.0, 0.2);
        t(&n("layer_output_norm.weight"), 1, d, 1.0, 0.2);
        t(&n("layer_output_norm.bias"), 1, d, 0.0, 0.2);
    }
    out
}

/// The GGUF bytes of the seeded `bert` model `m` (matrices in `m.matrix_type`, `token_embd` in
/// `m.embd_type`, vectors, `token_types` and `position_embd` F32 as llama-quantize leaves them).
///
/// Errors: a type the engine cannot quantize to, widths that are not whole blocks.
pub(super) fn build_bert(m: &SynthModel) -> crate::Result<Vec<u8>> {
    let vocab = bert_vocab();
    let mut w = GgufWriter::new();
    let s = |x: &str| MetaValue::String(x.to_string());
    let u = MetaValue::U32;
    let key = |k: &str| format!("bert.{k}");
    w.add_metadata("general.architecture", s("bert"));
    w.add_metadata("general.name", s("tiny-bert (synthetic)"));
    w.add_metadata(&key("context_length"), u(SYNTH_BERT_CONTEXT as u32));
    w.add_metadata(&key("embedding_length"), u(m.d_model as u32));
    w.add_metadata(&key("feed_forward_length"), u(m.d_ff as u32));
    w.add_metadata(&key("block_count"), u(m.n_layer as u32));
    w.add_metadata(&key("attention.head_count"), u(m.n_head as u32));
    w.add_metadata(
        &key("attention.layer_norm_epsilon"),
        MetaValue::F32(m.norm_eps),
    );
    w.add_metadata(&key("attention.causal"), MetaValue::Bool(false));
    w.add_metadata(&key("pooling_type"), u(SYNTH_BERT_POOLING));
    w.add_metadata(
        "tokenizer.ggml.token_type_count",
        u(SYNTH_BERT_TOKEN_TYPES as u32),
    );
    w.add_metadata("tokenizer.ggml.model", s("bert"));
    w.add_metadata("tokenizer.ggml.pre", s("default"));
    w.add_metadata(
        "tokenizer.ggml.tokens",
        MetaValue::Array(vocab.iter().map(|t| s(t)).collect()),
    );
    // llama_token_type: 3 CONTROL, 2 UNKNOWN, 1 NORMAL
    let types = (0..vocab.len())
        .map(|i| {
            MetaValue::I32(match i {
                1 => 2,
                i if i < BERT_SPECIALS.len() => 3,
                _ => 1,
            })
        })
        .collect();
    w.add_metadata("tokenizer.ggml.token_type", MetaValue::Array(types));
    // WPM prepends special_bos_id (the CLS token) and appends special_sep_id; llama.cpp reads no cls key
    for (k, id) in [
        ("bos_token_id", 2),
        ("unknown_token_id", 1),
        ("seperator_token_id", 3),
        ("padding_token_id", 0),
        ("cls_token_id", 2),
        ("mask_token_id", 4),
    ] {
        w.add_metadata(&format!("tokenizer.ggml.{k}"), u(id));
    }
    for t in bert_tensors(m) {
        let ty = match t.name.as_str() {
            "token_embd.weight" => m.embd_type,
            "token_types.weight" | "position_embd.weight" => GgmlType::F32,
            _ if t.rows > 1 => m.matrix_type,
            _ => GgmlType::F32,
        };
        if t.rows > 1 {
            add_matrix(&mut w, &t.name, &t.values, t.cols, ty)?;
        } else {
            w.add_tensor(&t.name, &[t.cols as u64], ty, quantize_row(ty, &t.values)?);
        }
    }
    Ok(w.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_has_the_phantom_space_form_and_unique_tokens() {
        let v = bert_vocab();
        let mut sorted = v.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), v.len(), "every token text once");
        assert_eq!(v[2], "[CLS]");
        assert!(v.iter().any(|t| t == "\u{2581}the") && v.iter().any(|t| t == "ll"));
    }

    #[test]
    fn the_wordpiece_block_tokenizes_as_llama_cpp() {
        // ids llama.cpp 0c1e570 (llama-cpp-python 0.3.36) gives on the seeded bert file, llama_tokenize(..,
        // add_special = true, parse_special = false): CLS first, SEP last, lowercased, punctuation split
        let bytes = SynthModel::preset("bert", 1).unwrap().build().unwrap();
        let g = crate::gguf::GgufFile::from_bytes(bytes, "synth-bert.gguf").unwrap();
        let tok = crate::tokenizer::Tokenizer::from_gguf(&g).unwrap();
        for (text, want) in [
            ("the hell is here", &[2u32, 87, 89, 90, 88, 89, 91, 3][..]),
            (
                "Hello, lockstep! x9 (a)",
                &[2, 89, 90, 55, 78, 92, 93, 79, 28, 76, 85, 5, 86, 3],
            ),
            ("zz?qq", &[2, 30, 66, 80, 21, 57, 3]),
        ] {
            assert_eq!(tok.encode(text, true, false).unwrap(), want, "{text:?}");
        }
        assert_eq!(tok.encode("the", false, false).unwrap(), [87]);
    }

    #[test]
    fn tensors_have_the_converters_names_and_shapes() {
        let m = SynthModel::preset("bert", 1).unwrap();
        let t = bert_tensors(&m);
        let get = |n: &str| t.iter().find(|x| x.name == n).unwrap();
        assert_eq!(get("position_embd.weight").rows, SYNTH_BERT_CONTEXT);
        assert_eq!(get("token_types.weight").rows, 2);
        assert_eq!(get("blk.1.ffn_up.weight").rows, m.d_ff);
        assert_eq!(get("blk.1.ffn_down.weight").cols, m.d_ff);
        assert!(t.iter().all(|x| !x.name.starts_with("output")));
        assert_eq!(bert_tensors(&m), t, "deterministic");
    }
}
