//! The Llama forward pass (Touvron et al. 2023), as llama.cpp builds it for `general.architecture = llama`
//! (src/models/llama.cpp, `llm_build_llama`):
//!
//! ```text
//! x = token_embd[tokens]
//! for each block:  h = RMSNorm(x)·w_attn_norm
//!                  q, k, v = h·Wq, h·Wk, h·Wv ; q, k = RoPE(q, k)   (interleaved pairs, LLAMA_ROPE_TYPE_NORM)
//!                  x = x + Wo · softmax(q·kᵀ/√d_head + causal mask) · v   (grouped-query attention)
//!                  h = RMSNorm(x)·w_ffn_norm
//!                  x = x + W_down · (silu(h·W_gate) ⊙ h·W_up)           (SwiGLU)
//! logits = RMSNorm(x)·w_output_norm · W_outᵀ   (W_out = token_embd when the file ties them)
//! ```
//! Tensor names are GGUF's (`blk.{i}.attn_q.weight`, ...). Every stage is emitted to the sink.

use crate::gguf::GgufFile;
use crate::hooks::{emit, Stage, StageKind, StageSink};
use crate::models::{load_vector, sized, Config, Scratch, Session, Weight};
use crate::ops;
use crate::quant;
use crate::Result;

/// Weights of one transformer block. Matrices stay quantized in the map; norm vectors are copied (f32).
#[derive(Debug)]
pub struct Block {
    /// `[d_model]`
    pub attn_norm: Vec<f32>,
    /// `[n_head·head_dim, d_model]`
    pub wq: Weight,
    /// `[n_kv_head·head_dim, d_model]`
    pub wk: Weight,
    /// `[n_kv_head·head_dim, d_model]`
    pub wv: Weight,
    /// `[d_model, n_head·head_dim]`
    pub wo: Weight,
    /// `[d_model]`
    pub ffn_norm: Vec<f32>,
    /// `[d_ff, d_model]`
    pub w_gate: Weight,
    /// `[d_ff, d_model]`
    pub w_up: Weight,
    /// `[d_model, d_ff]`
    pub w_down: Weight,
}

/// A Llama-architecture model's weights.
#[derive(Debug)]
pub struct Llama {
    /// `[n_vocab, d_model]`
    pub token_embd: Weight,
    /// The transformer blocks.
    pub blocks: Vec<Block>,
    /// `[d_model]`
    pub output_norm: Vec<f32>,
    /// `[n_vocab, d_model]`: `output.weight`, or `token_embd.weight` when tied.
    pub output: Weight,
}

/// Stages emitted by [`Llama::forward`], in order, with their widths.
pub fn stages(c: &Config) -> Vec<(Stage, usize)> {
    let q_width = c.n_head * c.head_dim;
    let kv_width = c.n_kv_head * c.head_dim;
    let mut out = vec![(Stage::global(StageKind::Embed), c.d_model)];
    for l in 0..c.n_layer {
        use StageKind::*;
        for (kind, w) in [
            (AttnNorm, c.d_model),
            (Q, q_width),
            (K, kv_width),
            (V, kv_width),
            (QRope, q_width),
            (KRope, kv_width),
            (AttnOut, q_width),
            (AttnProj, c.d_model),
            (FfnInp, c.d_model),
            (FfnNorm, c.d_model),
            (FfnGate, c.d_ff),
            (FfnUp, c.d_ff),
            (FfnAct, c.d_ff),
            (FfnOut, c.d_model),
            (Out, c.d_model),
        ] {
            out.push((Stage::block(l, kind), w));
        }
    }
    out.push((Stage::global(StageKind::OutputNorm), c.d_model));
    out.push((Stage::global(StageKind::Logits), c.n_vocab));
    out
}

impl Llama {
    /// Look up and shape-check every tensor (errors name the file and tensor).
    pub fn load(g: &GgufFile, c: &Config) -> Result<Llama> {
        let (d, qw, kvw) = (c.d_model, c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
        let token_embd = Weight::load(g, "token_embd.weight", None, Some(d))?;
        let mut blocks = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let name = |t: &str| format!("blk.{i}.{t}.weight");
            blocks.push(Block {
                attn_norm: load_vector(g, &name("attn_norm"), d)?,
                wq: Weight::load(g, &name("attn_q"), Some(qw), Some(d))?,
                wk: Weight::load(g, &name("attn_k"), Some(kvw), Some(d))?,
                wv: Weight::load(g, &name("attn_v"), Some(kvw), Some(d))?,
                wo: Weight::load(g, &name("attn_output"), Some(d), Some(qw))?,
                ffn_norm: load_vector(g, &name("ffn_norm"), d)?,
                w_gate: Weight::load(g, &name("ffn_gate"), Some(c.d_ff), Some(d))?,
                w_up: Weight::load(g, &name("ffn_up"), Some(c.d_ff), Some(d))?,
                w_down: Weight::load(g, &name("ffn_down"), Some(d), Some(c.d_ff))?,
            });
        }
        let output = match g.tensor("output.weight") {
            Ok(_) => Weight::load(g, "output.weight", Some(c.n_vocab), Some(d))?,
            Err(_) => token_embd.clone(),
        };
        Ok(Llama {
            token_embd,
            blocks,
            output_norm: load_vector(g, "output_norm.weight", d)?,
            output,
        })
    }

    /// One forward pass over `tokens` at positions `session.n_past() ..`; logits land in the session's
    /// scratch (`[T, n_vocab]`). The caller ([`crate::models::Model::forward`]) has checked ids and capacity.
    pub(crate) fn forward(
        &self,
        g: &GgufFile,
        c: &Config,
        session: &mut Session,
        tokens: &[u32],
        mut sink: Option<&mut dyn StageSink>,
    ) -> Result<()> {
        let Session {
            kv,
            n_past,
            mode,
            backend,
            scratch,
        } = session;
        let Scratch {
            x,
            h,
            q,
            k,
            v,
            att,
            proj,
            gate,
            up,
            logits,
            rope,
            scores,
            mm,
        } = scratch;
        let (mode, p0, t_len) = (*mode, *n_past, tokens.len());
        let pos = p0..p0 + t_len;
        let (d, hd) = (c.d_model, c.head_dim);
        let (qw, kvw) = (c.n_head * hd, c.n_kv_head * hd);

        // x = token_embd[tokens]                                   [T, d]
        let x = sized(x, t_len * d);
        let embd = self.token_embd.matrix(g);
        for (row, &tok) in x.chunks_exact_mut(d).zip(tokens) {
            quant::dequantize_row(embd.ty, embd.row(tok as usize), row)?;
        }
        emit(
            &mut sink,
            Stage::global(StageKind::Embed),
            pos.clone(),
            d,
            x,
        );

        let (h, q, k, v) = (
            sized(h, t_len * d),
            sized(q, t_len * qw),
            sized(k, t_len * kvw),
            sized(v, t_len * kvw),
        );
        let (att, proj) = (sized(att, t_len * qw), sized(proj, t_len * d));
        let (gate, up) = (sized(gate, t_len * c.d_ff), sized(up, t_len * c.d_ff));
        let rope = sized(rope, c.rope_dim);
        let scores = sized(scores, ops::attention_scratch_len(p0 + t_len));

        for (l, b) in self.blocks.iter().enumerate() {
            let st = |kind| Stage::block(l, kind);

            // ---- attention ----
            // h = RMSNorm(x) · w_attn_norm                        [T, d]
            h.copy_from_slice(x);
            ops::rms_norm(h, &b.attn_norm, c.norm_eps);
            emit(&mut sink, st(StageKind::AttnNorm), pos.clone(), d, h);

            // q = h·Wqᵀ [T, n_head·hd];  k, v = h·Wkᵀ, h·Wvᵀ [T, n_kv_head·hd]
            backend.matmul(&b.wq.matrix(g), h, t_len, q, mode, mm)?;
            emit(&mut sink, st(StageKind::Q), pos.clone(), qw, q);
            backend.matmul(&b.wk.matrix(g), h, t_len, k, mode, mm)?;
            emit(&mut sink, st(StageKind::K), pos.clone(), kvw, k);
            backend.matmul(&b.wv.matrix(g), h, t_len, v, mode, mm)?;
            emit(&mut sink, st(StageKind::V), pos.clone(), kvw, v);

            // RoPE on q and k, each token at its own absolute position
            for (t, (qt, kt)) in q
                .chunks_exact_mut(qw)
                .zip(k.chunks_exact_mut(kvw))
                .enumerate()
            {
                ops::rope_cache(p0 + t, c.rope_base, c.rope_dim, rope);
                ops::rope_norm(qt, hd, c.rope_dim, rope, mode);
                ops::rope_norm(kt, hd, c.rope_dim, rope, mode);
            }
            emit(&mut sink, st(StageKind::QRope), pos.clone(), qw, q);
            emit(&mut sink, st(StageKind::KRope), pos.clone(), kvw, k);

            // write k, v of token t at position p0 + t
            for (t, (kt, vt)) in k.chunks_exact(kvw).zip(v.chunks_exact(kvw)).enumerate() {
                kv.write(l, p0 + t, kt, vt)?;
            }

            // att = softmax(q·kᵀ/√hd, causal) · v, heads concatenated   [T, n_head·hd]
            for (t, (qt, at)) in q.chunks_exact(qw).zip(att.chunks_exact_mut(qw)).enumerate() {
                ops::attention(
                    qt,
                    kv,
                    l,
                    p0 + t,
                    c.n_head,
                    c.n_kv_head,
                    hd,
                    scores,
                    at,
                    mode,
                );
            }
            emit(&mut sink, st(StageKind::AttnOut), pos.clone(), qw, att);

            // proj = att·Woᵀ                                       [T, d]
            backend.matmul(&b.wo.matrix(g), att, t_len, proj, mode, mm)?;
            emit(&mut sink, st(StageKind::AttnProj), pos.clone(), d, proj);

            // x = x + proj  (residual)
            ops::add_in_place(x, proj);
            emit(&mut sink, st(StageKind::FfnInp), pos.clone(), d, x);

            // ---- feed-forward (SwiGLU) ----
            h.copy_from_slice(x);
            ops::rms_norm(h, &b.ffn_norm, c.norm_eps);
            emit(&mut sink, st(StageKind::FfnNorm), pos.clone(), d, h);

            backend.matmul(&b.w_gate.matrix(g), h, t_len, gate, mode, mm)?;
            emit(&mut sink, st(StageKind::FfnGate), pos.clone(), c.d_ff, gate);
            backend.matmul(&b.w_up.matrix(g), h, t_len, up, mode, mm)?;
            emit(&mut sink, st(StageKind::FfnUp), pos.clone(), c.d_ff, up);
            // gate = silu(gate) ⊙ up                               [T, d_ff]
            ops::swiglu(gate, up, c.d_ff, mode);
            emit(&mut sink, st(StageKind::FfnAct), pos.clone(), c.d_ff, gate);

            // proj = (silu(gate) ⊙ up)·W_downᵀ                   [T, d]
            backend.matmul(&b.w_down.matrix(g), gate, t_len, proj, mode, mm)?;
            emit(&mut sink, st(StageKind::FfnOut), pos.clone(), d, proj);

            ops::add_in_place(x, proj);
            emit(&mut sink, st(StageKind::Out), pos.clone(), d, x);
        }

        // logits = RMSNorm(x)·w_output_norm · W_outᵀ               [T, n_vocab]
        h.copy_from_slice(x);
        ops::rms_norm(h, &self.output_norm, c.norm_eps);
        emit(
            &mut sink,
            Stage::global(StageKind::OutputNorm),
            pos.clone(),
            d,
            h,
        );
        let logits = sized(logits, t_len * c.n_vocab);
        backend.matmul(&self.output.matrix(g), h, t_len, logits, mode, mm)?;
        emit(
            &mut sink,
            Stage::global(StageKind::Logits),
            pos,
            c.n_vocab,
            logits,
        );
        Ok(())
    }
}
