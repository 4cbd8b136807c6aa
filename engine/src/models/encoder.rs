//! The shared blocks of an encoder-only transformer (BERT; llama.cpp src/models/bert.cpp), each computing and
//! emitting its stages like [`super::blocks`]:
//!
//! - [`EncoderEmbedding`]: `token_embd[t] + token_types[0] + position_embd[p]`, then LayerNorm → `embed`
//!   (the input of block 0: llama.cpp's `inp_norm`);
//! - [`EncoderLayer`]: bidirectional attention over the batch with Q/K/V and output biases (no RoPE, no KV
//!   cache), then the post-norm residual wiring `x = LN(x + attn)`, `x = LN(x + ffn(x))` → `q`, `k`, `v`,
//!   `attn_out`, `attn_proj`, `ffn_inp`, the FFN's stages ([`Ffn`], non-gated GELU with biases), `out`;
//! - [`Pooling`] → `pooled`, the model's output (one row per sequence);
//! - [`Encoder`]: embedding → layers → pooling.
//!
//! An encoder has no KV cache and no decode step: a sequence is one forward pass over all its tokens, from
//! position 0 ([`crate::models::Model::forward`] refuses anything else).

use rayon::prelude::*;

use crate::faults::{self, Fault};
use crate::gguf::GgufFile;
use crate::hooks::{Stage, StageKind};
use crate::models::blocks::{add_bias, sized, Ffn, FfnBufs, Fwd, NormKind, RmsNorm};
use crate::models::weights::{load_vector, Weight};
use crate::numerics::NumericsMode;
use crate::ops::{self, ggml_cpu, AttnShape};
use crate::quant::{self, x86::Emulated};
use crate::{Error, Result};

/// How an encoder turns its last block's rows into one embedding (llama.cpp `llama_pooling_type`,
/// `<arch>.pooling_type`; `build_pooling` in src/llama-graph.cpp).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// `LLAMA_POOLING_TYPE_MEAN` (1): `ggml_mul_mat(cont(transpose(x)), inp_mean)` with `inp_mean` = `1/n`
    /// (`1.0f/float(n)`) per token.
    Mean,
    /// `LLAMA_POOLING_TYPE_CLS` (2): the first row (`ggml_get_rows` of `inp_cls`).
    Cls,
    /// `LLAMA_POOLING_TYPE_LAST` (3): the last row.
    Last,
}

impl Pooling {
    /// The pooling of `<arch>.pooling_type` `v`.
    ///
    /// Errors: NONE (0: per-token embeddings, no pooled output), RANK (4: a classifier head) and unknown
    /// values are [`Error::Unsupported`].
    pub fn from_gguf(v: usize, path: &std::path::Path) -> Result<Pooling> {
        match v {
            1 => Ok(Pooling::Mean),
            2 => Ok(Pooling::Cls),
            3 => Ok(Pooling::Last),
            _ => Err(Error::Unsupported(format!(
                "{}: pooling_type {v} is not implemented (supported: 1 mean, 2 cls, 3 last)",
                path.display()
            ))),
        }
    }
}

/// BERT's input embedding: token row + token-type row 0 + position row, then LayerNorm with bias.
#[derive(Debug)]
pub struct EncoderEmbedding {
    /// `token_embd` `[n_vocab, d_model]`.
    pub token: Weight,
    /// Row 0 of `token_types` (`[d_model]`; llama.cpp feeds every token as type 0, "sentence A"), when the
    /// file has the tensor.
    pub token_type0: Option<Vec<f32>>,
    /// `position_embd` `[n_ctx_train, d_model]`.
    pub position: Weight,
    /// `token_embd_norm` (LayerNorm, weight and bias).
    pub norm: RmsNorm,
}

impl EncoderEmbedding {
    /// `x` (`[n, d]`) ← the normed embeddings of `tokens` at positions `f.positions()`; emits `embed`.
    ///
    /// Order of the f32 adds as llama.cpp's graph: `(token + type0)`, then `position + that` (one rounding
    /// each; the adds commute).
    fn forward(
        &self,
        f: &mut Fwd,
        tokens: &[u32],
        x: &mut [f32],
        row: &mut Vec<f32>,
    ) -> Result<()> {
        let d = self.token.cols;
        let (tok, pos) = (self.token.matrix(f.g), self.position.matrix(f.g));
        let row = sized(row, d);
        for ((xt, &t), p) in x.chunks_exact_mut(d).zip(tokens).zip(f.positions()) {
            quant::dequantize_row_with(tok.ty, tok.row(t as usize), xt, f.num.simd)?;
            if let Some(ty) = self
                .token_type0
                .as_ref()
                .filter(|_| !faults::is(Fault::TokenTypeDropped))
            {
                ops::add_in_place(xt, ty);
            }
            quant::dequantize_row_with(pos.ty, pos.row(p), row, f.num.simd)?;
            ops::add_in_place(xt, row);
        }
        self.norm.forward(f, x, Stage::global(StageKind::Embed));
        Ok(())
    }
}

/// Q/K/V and output projections of one encoder block, each with its bias (BERT: `attn_{q,k,v}`,
/// `attn_output`, weights `[d, d]` and biases `[d]`).
#[derive(Debug)]
pub struct EncoderAttention {
    /// Block index.
    pub layer: usize,
    /// `attn_q`, `attn_k`, `attn_v` weights.
    pub w: [Weight; 3],
    /// Their biases (`attn_q.bias`, ...), when the file has them (llama.cpp: optional).
    pub bias: [Option<Vec<f32>>; 3],
    /// `attn_output.weight`.
    pub wo: Weight,
    /// `attn_output.bias`, when the file has it.
    pub wo_bias: Option<Vec<f32>>,
    /// Heads and scale (1/√head_dim); no window, no soft-cap.
    pub shape: AttnShape,
}

/// Buffers of one [`Encoder`] forward (resized, never shrunk).
#[derive(Default)]
pub struct EncoderBufs {
    /// Residual stream `[n, d]`.
    x: Vec<f32>,
    /// Sub-layer output `[n, d]`.
    proj: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    /// One embedding row.
    row: Vec<f32>,
    ffn: FfnBufs,
    /// The pooled embedding `[1, d]`: what [`crate::models::Model::forward`] returns for an encoder.
    pub pooled: Vec<f32>,
}

impl EncoderAttention {
    /// `out` (`[n, d]`) ← the block's attention output projection of `x` (`[n, d]`), every query attending to
    /// every key of the batch.
    fn forward(&self, f: &mut Fwd, x: &[f32], b: &mut EncoderBufs, out: &mut [f32]) -> Result<()> {
        let st = |kind| Stage::block(self.layer, kind);
        let n = f.n;
        let AttnShape {
            n_head,
            n_kv_head,
            head_dim,
            ..
        } = self.shape;
        let (qw, kvw) = (n_head * head_dim, n_kv_head * head_dim);
        let bufs = [
            sized(&mut b.q, n * qw),
            sized(&mut b.k, n * kvw),
            sized(&mut b.v, n * kvw),
        ];
        let kinds = [StageKind::Q, StageKind::K, StageKind::V];
        let [q, k, v] = bufs;
        for (i, out) in [&mut *q, &mut *k, &mut *v].into_iter().enumerate() {
            f.matmul(&self.w[i], x, out)?;
            if let Some(bias) = self.bias[i]
                .as_ref()
                .filter(|_| !faults::is(Fault::QkvBiasMissing))
            {
                add_bias(out, bias);
            }
            f.emit(st(kinds[i]), out);
        }
        let mut shape = self.shape;
        if faults::is(Fault::AttnScale) {
            shape.kq_scale /= (head_dim as f32).sqrt();
        }
        let att = sized(&mut b.att, n * qw);
        let causal = faults::is(Fault::EncoderCausalMask);
        ops::attention_no_cache(q, k, v, n, &shape, causal, att, f.num);
        f.emit(st(StageKind::AttnOut), att);
        f.matmul(&self.wo, att, out)?;
        if let Some(bias) = &self.wo_bias {
            add_bias(out, bias);
        }
        f.emit(st(StageKind::AttnProj), out);
        Ok(())
    }
}

/// One post-norm encoder block (Vaswani et al. 2017; Devlin et al. 2019):
///
/// ```text
/// x = LN(x + Wo·attn(x) + bo)          → ffn_inp   (attn_output_norm)
/// x = LN(x + ffn(x))                   → out       (layer_output_norm)
/// ```
#[derive(Debug)]
pub struct EncoderLayer {
    /// Block index.
    pub layer: usize,
    /// Self-attention.
    pub attn: EncoderAttention,
    /// `attn_output_norm` (LayerNorm with bias).
    pub attn_out_norm: RmsNorm,
    /// Feed-forward (non-gated GELU, biases).
    pub ffn: Ffn,
    /// `layer_output_norm` (LayerNorm with bias).
    pub out_norm: RmsNorm,
}

impl EncoderLayer {
    fn forward(&self, f: &mut Fwd, b: &mut EncoderBufs) -> Result<()> {
        let st = |kind| Stage::block(self.layer, kind);
        let len = b.x.len();
        let mut proj = std::mem::take(&mut b.proj);
        let mut x = std::mem::take(&mut b.x);
        let proj_s = sized(&mut proj, len);
        let r = self.attn.forward(f, &x, b, proj_s);
        if r.is_ok() {
            // ffn_inp = LN(attn + x)
            ops::add_in_place(&mut x, proj_s);
            self.attn_out_norm.forward(f, &mut x, st(StageKind::FfnInp));
        }
        let r = r.and_then(|_| self.ffn.forward(f, &x, &mut b.ffn, proj_s));
        if r.is_ok() {
            // out = LN(ffn_out + ffn_inp)
            if faults::active() == Some(Fault::MissingResidual { layer: self.layer }) {
                x.copy_from_slice(proj_s);
            } else {
                ops::add_in_place(&mut x, proj_s);
            }
            self.out_norm.forward(f, &mut x, st(StageKind::Out));
        }
        b.proj = proj;
        b.x = x;
        r
    }
}

/// An encoder-only transformer: embedding, post-norm blocks, pooling.
#[derive(Debug)]
pub struct Encoder {
    /// Input embedding.
    pub embed: EncoderEmbedding,
    /// The blocks, in order.
    pub layers: Vec<EncoderLayer>,
    /// How the output is pooled.
    pub pooling: Pooling,
}

/// What an encoder file states besides [`crate::models::DecoderDims`].
#[derive(Clone, Copy, Debug)]
pub struct EncoderWiring {
    /// LayerNorm epsilon.
    pub norm_eps: f32,
    /// Pooling.
    pub pooling: Pooling,
}

impl Encoder {
    /// Look up and shape-check every tensor of a BERT-style encoder with dimensions `c` (GGUF names:
    /// `token_embd`, `token_types`, `position_embd`, `token_embd_norm`, `blk.{l}.attn_{q,k,v}`,
    /// `attn_output`, `attn_output_norm`, `ffn_up`, `ffn_down`, `layer_output_norm`; biases where the file
    /// has them, as llama.cpp's `TENSOR_NOT_REQUIRED`, the norms' biases required).
    ///
    /// Errors: a missing or misshapen tensor, an unsupported type (naming file and tensor); fused
    /// `attn_qkv` and per-head Q/K norms (Jina/Nomic variants) are [`Error::Unsupported`].
    pub fn load(
        g: &GgufFile,
        c: &crate::models::hparams::DecoderDims,
        w: EncoderWiring,
    ) -> Result<Encoder> {
        let d = c.d_model;
        for t in ["blk.0.attn_qkv.weight", "blk.0.attn_q_norm.weight"] {
            if g.tensor(t).is_ok() {
                return Err(Error::Unsupported(format!(
                    "{}: {t} (a fused or normed Q/K/V encoder) is not implemented",
                    g.path().display()
                )));
            }
        }
        let opt = |name: &str, len: usize| -> Result<Option<Vec<f32>>> {
            match g.tensor(name) {
                Ok(_) => Ok(Some(load_vector(g, name, len)?)),
                Err(_) => Ok(None),
            }
        };
        let ln = |prefix: &str| -> Result<RmsNorm> {
            let n = RmsNorm::load_kind(g, prefix, d, w.norm_eps, NormKind::Layer)?;
            if n.bias.is_none() {
                // bert.cpp loads every LayerNorm bias as required
                return Err(Error::Model {
                    path: g.path().to_path_buf(),
                    what: format!("tensor {prefix}.bias is missing"),
                });
            }
            Ok(n)
        };
        let token_type0 = match g.tensor("token_types.weight") {
            Ok(_) => {
                let t = Weight::load(g, "token_types.weight", None, Some(d))?;
                let mut row = vec![0f32; d];
                let m = t.matrix(g);
                // at load, before a `--simd` setting is known: the portable code (`load_vector`'s rule)
                quant::dequantize_row_with(m.ty, m.row(0), &mut row, crate::Simd::Off)?;
                Some(row)
            }
            Err(_) => None,
        };
        let embed = EncoderEmbedding {
            token: Weight::load(g, "token_embd.weight", Some(c.n_vocab), Some(d))?,
            token_type0,
            position: Weight::load(g, "position_embd.weight", Some(c.n_ctx_train), Some(d))?,
            norm: ln("token_embd_norm")?,
        };
        let (qw, kvw) = (c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
        let layers = (0..c.n_layer)
            .map(|l| {
                let name = |t: &str| format!("blk.{l}.{t}");
                let mat = |t: &str, rows| Weight::load(g, &name(t), Some(rows), Some(d));
                Ok(EncoderLayer {
                    layer: l,
                    attn: EncoderAttention {
                        layer: l,
                        w: [
                            mat("attn_q.weight", qw)?,
                            mat("attn_k.weight", kvw)?,
                            mat("attn_v.weight", kvw)?,
                        ],
                        bias: [
                            opt(&name("attn_q.bias"), qw)?,
                            opt(&name("attn_k.bias"), kvw)?,
                            opt(&name("attn_v.bias"), kvw)?,
                        ],
                        wo: Weight::load(g, &name("attn_output.weight"), Some(d), Some(qw))?,
                        wo_bias: opt(&name("attn_output.bias"), d)?,
                        shape: AttnShape::causal(c.n_head, c.n_kv_head, c.head_dim),
                    },
                    attn_out_norm: ln(&name("attn_output_norm"))?,
                    ffn: Ffn::load(
                        g,
                        l,
                        (d, c.d_ff),
                        crate::models::blocks::GluAct::GeluTanh,
                        false,
                    )?,
                    out_norm: ln(&name("layer_output_norm"))?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Encoder {
            embed,
            layers,
            pooling: w.pooling,
        })
    }

    /// One forward pass over the whole sequence `tokens` (positions `0..n`); the pooled embedding lands in
    /// `b.pooled` (`[1, d]`).
    pub(crate) fn forward(&self, f: &mut Fwd, b: &mut EncoderBufs, tokens: &[u32]) -> Result<()> {
        let d = self.embed.token.cols;
        let n = tokens.len();
        let mut x = std::mem::take(&mut b.x);
        let xs = sized(&mut x, n * d);
        let r = self.embed.forward(f, tokens, xs, &mut b.row);
        b.x = x;
        r?;
        for l in &self.layers {
            l.forward(f, b)?;
        }
        let pooling = match (self.pooling, faults::is(Fault::PoolingWrong)) {
            (p, false) => p,
            (Pooling::Mean, true) => Pooling::Cls,
            (_, true) => Pooling::Mean,
        };
        let pooled = sized(&mut b.pooled, d);
        pool(pooling, &b.x, n, pooled, f.num);
        // one row, at the batch's last position (as the output head of a last-only batch)
        let batch = (f.p0, f.n);
        (f.p0, f.n) = (f.p0 + n - 1, 1);
        f.emit(Stage::global(StageKind::Pooled), pooled);
        (f.p0, f.n) = batch;
        Ok(())
    }
}

/// `out` (`[d]`) ← the pooling of `x` (`[n, d]`). Mean: reference mode `Σ_t x[t][j] · (1/n)` summed in f32
/// in order; ggml mode `ggml_vec_dot_f32(n, x[·][j], inp_mean)` per dimension (`llamafile_sgemm` refuses a
/// single sequence column, `n < 2`), with the target's lanes and leftovers.
fn pool(p: Pooling, x: &[f32], n: usize, out: &mut [f32], num: crate::numerics::Numerics) {
    let d = out.len();
    match p {
        Pooling::Cls => out.copy_from_slice(&x[..d]),
        Pooling::Last => out.copy_from_slice(&x[(n - 1) * d..][..d]),
        Pooling::Mean => {
            let inv = 1.0f32 / n as f32;
            let means = vec![inv; n];
            out.par_iter_mut().enumerate().for_each(|(j, o)| {
                *o = match num.mode {
                    NumericsMode::Reference => (0..n).map(|t| x[t * d + j] * inv).sum(),
                    NumericsMode::Ggml => ggml_cpu::vec_dot_f32_by::<Emulated>(
                        num.target,
                        n,
                        |t| x[t * d + j],
                        &means,
                    ),
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::Numerics;

    #[test]
    fn pooling_types_and_refusals() {
        let p = std::path::Path::new("m.gguf");
        assert_eq!(Pooling::from_gguf(1, p).unwrap(), Pooling::Mean);
        assert_eq!(Pooling::from_gguf(2, p).unwrap(), Pooling::Cls);
        let e = Pooling::from_gguf(0, p).unwrap_err().to_string();
        assert!(e.contains("m.gguf") && e.contains("pooling_type 0"), "{e}");
        let x = [1.0f32, 2.0, 3.0, 5.0, 8.0, 14.0];
        let mut out = [0f32; 2];
        for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
            let num = Numerics::new(mode);
            pool(Pooling::Mean, &x, 3, &mut out, num);
            assert!(
                (out[0] - 4.0).abs() < 1e-6 && (out[1] - 7.0).abs() < 1e-6,
                "{out:?}"
            );
            pool(Pooling::Cls, &x, 3, &mut out, num);
            assert_eq!(out, [1.0, 2.0]);
            pool(Pooling::Last, &x, 3, &mut out, num);
            assert_eq!(out, [8.0, 14.0]);
        }
    }
}
