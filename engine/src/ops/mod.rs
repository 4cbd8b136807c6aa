//! Shared numeric blocks of transformer forward passes: RMSNorm, RoPE (NORM and NeoX), softmax, SiLU- and
//! GELU-gated units and causal (optionally sliding-window) grouped-query attention over the KV cache.
//!
//! Activations are row-major `[n_tokens, width]` f32 slices. Ops whose arithmetic differs between the two
//! numerics modes take a [`NumericsMode`]:
//!
//! - **reference**: plain f32 math (libm `exp`, left-to-right f32 dot products) — the formulas as written;
//! - **ggml**: what llama.cpp's CPU backend computes on the golden's host, bit for bit: the AVX2 or AVX-512
//!   kernels of ggml-cpu ([`GgmlTarget`]) replicated lane by lane in [`ggml_cpu`] (polynomial `exp` in SiLU
//!   and softmax, 8- or 16-lane accumulators and reduction trees in the attention dot products, the fmas gcc
//!   contracted in RoPE).
//!
//! | op | ggml function mirrored (both modes follow its order of operations; ggml mode also its SIMD) |
//! |---|---|
//! | [`rms_norm`] | `ggml_compute_forward_rms_norm_f32` (+ `ggml_mul`, fused on CPU) — same in both modes |
//! | [`rope_cache`] | `ggml_rope_cache_init` / `rope_yarn` — same in both modes |
//! | [`rope_norm`] | `rotate_pairs` (`GGML_ROPE_TYPE_NORMAL`); ggml mode: gcc's fma contraction |
//! | [`rope_neox`] | `rotate_pairs` (`GGML_ROPE_TYPE_NEOX`); ggml mode: gcc's fma contraction |
//! | [`geglu`] | `ggml_vec_geglu_f32` (`GGML_GLU_OP_GEGLU`); ggml mode: the f16 GELU table |
//! | [`scale`] | `ggml_vec_scale_f32` — same in both modes |
//! | [`swiglu`] | `ggml_vec_swiglu_f32` (`GGML_GLU_OP_SWIGLU`); ggml mode: `ggml_v_silu` lanes + scalar tail |
//! | [`softmax_scaled`] | reference mode of `ggml_compute_forward_soft_max_f32` |
//! | [`attention`] | `build_attn_mha` without flash attention: `mul_mat(k, q)`, `soft_max_ext`, `mul_mat(v, kq)` |
//! | [`add_in_place`] | `ggml_compute_forward_add` (f32 + f32, one rounding: same in both modes) |
//!
//! Where llama.cpp itself is not batch-invariant (the KQV product runs through llamafile's tinyBLAS when a
//! batch has ≥ 2 tokens and through `ggml_vec_dot_f32` for a single token), ggml mode does the same —
//! [`ggml_kqv_order`] — so a cached decode step equals llama.cpp's decode step, not a re-prefill.

pub mod ggml_cpu;

/// Transitional re-export for harness code that names `lockstep_engine::ops::GgmlTarget`; the type lives in
/// [`crate::numerics`].
pub use crate::numerics::GgmlTarget;

use rayon::prelude::*;

use crate::kv_cache::KvCache;
use crate::numerics::{Numerics, NumericsMode, Simd};
use crate::quant::x86::{Emulated, Fma, Hardware, HardwareAvx512};

/// RMSNorm in place on every row of `x` (`[n_rows, width]`), then multiply by `weight` (`[width]`).
///
/// y = x · 1/sqrt(mean(x²) + eps) · w, with the sum of squares accumulated in f64 (one f32 square at a
/// time, left to right) and the mean and scale in f32, as ggml-cpu `ggml_compute_forward_rms_norm_f32`
/// (ops.cpp) — in this version fused with the weight multiply (`ggml_compute_forward_rms_norm_mul_fused`,
/// `y = x·scale·w`); the unfused path (`ggml_vec_scale_f32` then `ggml_mul`) rounds the same way,
/// `(x·scale)·w`. There is nothing gcc can contract here, so both modes run this. Zhang & Sennrich 2019.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let width = weight.len();
    for_row_chunks(x, width, |rows| {
        for row in rows.chunks_exact_mut(width) {
            let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
            let mean = (sum / width as f64) as f32;
            let scale = 1.0f32 / (mean + eps).sqrt();
            for (v, &w) in row.iter_mut().zip(weight) {
                *v = *v * scale * w;
            }
        }
    });
}

/// Elements per task of the row-wise ops of a prompt batch ([`for_row_chunks`]): rows are gathered
/// until a chunk holds about this many, so that a task is worth its scheduling.
const PAR_CHUNK_ELEMS: usize = 16 * 1024;

/// `f` on consecutive chunks of whole rows of `x` (`[n_rows, width]`), in parallel when `x` holds more
/// than one chunk of [`PAR_CHUNK_ELEMS`] (a prompt batch), else in one call on this thread (a decode
/// step: no task, no allocation). For ops that treat each row on its own, so the split never changes a
/// bit.
pub(crate) fn for_row_chunks(x: &mut [f32], width: usize, f: impl Fn(&mut [f32]) + Sync) {
    let rows_per = (PAR_CHUNK_ELEMS / width.max(1)).max(1);
    if width == 0 || x.len() <= rows_per * width || rayon::current_num_threads() == 1 {
        f(x);
    } else {
        x.par_chunks_mut(rows_per * width).for_each(&f);
    }
}

/// [`for_row_chunks`] over two arrays of the same shape, chunked alike (`y` read-only).
pub(crate) fn for_row_chunks2(
    x: &mut [f32],
    y: &[f32],
    width: usize,
    f: impl Fn(&mut [f32], &[f32]) + Sync,
) {
    assert_eq!(x.len(), y.len());
    let rows_per = (PAR_CHUNK_ELEMS / width.max(1)).max(1);
    if width == 0 || x.len() <= rows_per * width || rayon::current_num_threads() == 1 {
        f(x, y);
    } else {
        x.par_chunks_mut(rows_per * width)
            .zip(y.par_chunks(rows_per * width))
            .for_each(|(a, b)| f(a, b));
    }
}

/// Precomputed cos/sin for rotary position embeddings of one position: `[rope_dim]` interleaved as
/// `cos0, sin0, cos1, sin1, ...` (ggml-cpu `ggml_rope_cache_init` + `rope_yarn` with ext_factor = 0,
/// freq_scale = 1, attn_factor = 1, no freq_factors: every extra factor is an exact multiplication by 1).
///
/// θ_i = pos · base^(−2i/d) computed as ggml does: `theta_scale = powf(base, -2.0f/d)` and θ multiplied by
/// it once per pair (a running f32 product, not a fresh `powf` per pair), θ₀ = `(float)pos`; cos and sin
/// from glibc's `cosf`/`sinf` (gcc merges them into one `sincosf` call, same values; Rust's `f32::cos`
/// and `f32::sin` are the same glibc functions). Identical in both modes. Su et al. 2021 (RoFormer).
pub fn rope_cache(pos: usize, base: f32, rope_dim: usize, out: &mut [f32]) {
    let theta_scale = base.powf(-2.0 / rope_dim as f32);
    let mut theta = pos as f32;
    for pair in out[..rope_dim].chunks_exact_mut(2) {
        pair[0] = theta.cos();
        pair[1] = theta.sin();
        theta *= theta_scale;
    }
}

/// RoPE in the "normal" (GPT-J, interleaved-pairs) layout on every head of one token, in place:
/// pairs `(x[2i], x[2i+1])` of each head are rotated by θ_i. `x`: `[n_head · head_dim]`; the first
/// `rope_dim` entries of each head are rotated, the rest pass through.
///
/// This is llama.cpp's `LLAMA_ROPE_TYPE_NORM`, used for arch `llama`: the GGUF converter permutes the Q and
/// K weights (convert_hf_to_gguf.py `LlamaModel.permute`) so that HF's half-split "neox" rotation becomes
/// this interleaved one. ggml-cpu `rotate_pairs` with `n_offset = 1`: reference mode evaluates the source
/// formula `(x0·cos − x1·sin, x0·sin + x1·cos)` with four rounded products; ggml mode the fmas gcc
/// compiled it into ([`ggml_cpu::rotate_pairs_norm`]).
pub fn rope_norm(
    x: &mut [f32],
    head_dim: usize,
    rope_dim: usize,
    cache: &[f32],
    mode: NumericsMode,
) {
    rope_norm_simd(x, head_dim, rope_dim, cache, Numerics::new(mode))
}

/// [`rope_norm`] in `num.mode`, in ggml mode with the hardware fma where `num.simd` runs the AVX2 kernels
/// (same bits; `num.target` is not read: RoPE is the same on both targets).
pub fn rope_norm_simd(
    x: &mut [f32],
    head_dim: usize,
    rope_dim: usize,
    cache: &[f32],
    num: Numerics,
) {
    rope_heads(false, x, (head_dim, rope_dim), cache, num.mode, num.simd)
}

/// The head loop of [`rope_norm_simd`] (`neox = false`) and [`rope_neox_simd`]: reference mode's four
/// rounded products, or ggml mode's fmas (the hardware's where `simd` runs the AVX2 kernels).
fn rope_heads(
    neox: bool,
    x: &mut [f32],
    (head_dim, rope_dim): (usize, usize),
    cache: &[f32],
    mode: NumericsMode,
    simd: Simd,
) {
    #[cfg(target_arch = "x86_64")]
    if mode == NumericsMode::Ggml && simd.avx2_kernels() {
        // SAFETY: AVX2 and FMA were detected on this CPU
        return unsafe { ggml_cpu::rotate_heads_fma(neox, x, head_dim, rope_dim, cache) };
    }
    let _ = simd;
    let half = rope_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        let rot = &mut head[..rope_dim];
        match (mode, neox) {
            (NumericsMode::Reference, false) => {
                for (pair, cs) in rot.chunks_exact_mut(2).zip(cache.chunks_exact(2)) {
                    let (x0, x1) = (pair[0], pair[1]);
                    pair[0] = x0 * cs[0] - x1 * cs[1];
                    pair[1] = x0 * cs[1] + x1 * cs[0];
                }
            }
            (NumericsMode::Reference, true) => {
                for (i, cs) in cache[..rope_dim].chunks_exact(2).enumerate() {
                    let (x0, x1) = (rot[i], rot[i + half]);
                    rot[i] = x0 * cs[0] - x1 * cs[1];
                    rot[i + half] = x0 * cs[1] + x1 * cs[0];
                }
            }
            (NumericsMode::Ggml, false) => ggml_cpu::rotate_pairs_norm(rot, cache),
            (NumericsMode::Ggml, true) => ggml_cpu::rotate_pairs_neox(rot, cache),
        }
    }
}

/// RoPE in the "NeoX" (GPT-NeoX, half-split) layout on every head of one token, in place: element `i` of
/// each head is paired with element `i + rope_dim/2` and the pair is rotated by θ_i (the same per-pair
/// angles and `cache` as [`rope_norm`]). `x`: `[n_head · head_dim]`; entries past `rope_dim` pass through.
///
/// llama.cpp's `LLAMA_ROPE_TYPE_NEOX` (Qwen2, Gemma 3, ...; HF `rotate_half`): ggml-cpu `rotate_pairs`
/// with `n_offset = n_dims/2` and `scale = 2` (ops.cpp, `ggml_compute_forward_rope_flt`). Reference mode:
/// four rounded products; ggml mode: [`ggml_cpu::rotate_pairs_neox`].
pub fn rope_neox(
    x: &mut [f32],
    head_dim: usize,
    rope_dim: usize,
    cache: &[f32],
    mode: NumericsMode,
) {
    rope_neox_simd(x, head_dim, rope_dim, cache, Numerics::new(mode))
}

/// [`rope_neox`] in `num.mode`, in ggml mode with the hardware fma where `num.simd` runs the AVX2 kernels
/// (same bits; `num.target` is not read: RoPE is the same on both targets).
pub fn rope_neox_simd(
    x: &mut [f32],
    head_dim: usize,
    rope_dim: usize,
    cache: &[f32],
    num: Numerics,
) {
    rope_heads(true, x, (head_dim, rope_dim), cache, num.mode, num.simd)
}

/// `x *= s` element-wise (`ggml_scale`: `ggml_vec_scale_f32`, one rounded product per element whatever
/// the SIMD width; the same in both modes). Gemma's embedding scale √d and its query pre-scale.
pub fn scale(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// GELU with the tanh approximation (Hendrycks & Gimpel 2016; HF `gelu_pytorch_tanh`), in f32:
/// `0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))` — the formula of ggml's `ggml_gelu_f32` (vec.h).
#[inline]
#[must_use]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const GELU_COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// GELU-gated linear unit in place on rows of `width`: `gate[i] = gelu_tanh(gate[i]) · up[i]` (GeGLU,
/// Shazeer 2020; Gemma's MLP, HF `GemmaMLP` with `gelu_pytorch_tanh`).
///
/// llama.cpp builds it as `ggml_geglu_split(ctx, gate, up)` (llama-graph.cpp `build_ffn`, `LLM_FFN_GELU` +
/// `LLM_FFN_PAR`), computed per row by `ggml_vec_geglu_f32`. Reference mode: [`gelu_tanh`] in f32. Ggml
/// mode: [`ggml_cpu::geglu_row`] (ggml's f16 lookup table, `GGML_GELU_FP16`).
pub fn geglu(gate: &mut [f32], up: &[f32], width: usize, mode: NumericsMode) {
    for_row_chunks2(gate, up, width, |gate, up| match mode {
        NumericsMode::Reference => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = gelu_tanh(*g) * u;
            }
        }
        NumericsMode::Ggml => {
            for (g, u) in gate.chunks_exact_mut(width).zip(up.chunks_exact(width)) {
                ggml_cpu::geglu_row(g, u);
            }
        }
    })
}

/// Softmax in place over `x`, with inputs pre-scaled by `scale`: p_i = exp(s·x_i − max) / Σ — the
/// reference-mode arithmetic of ggml-cpu `ggml_compute_forward_soft_max_f32`: scale, max, libm `exp`, the
/// sum accumulated in f64 one element at a time, normalisation by `(float)(1/sum)`. (Ggml mode:
/// [`ggml_cpu::soft_max_row`].) A row whose entries are all −∞ (fully masked) becomes all zeros instead of
/// NaN.
pub fn softmax_scaled(x: &mut [f32], scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for v in x.iter_mut() {
        *v *= scale;
        max = max.max(*v);
    }
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        let e = (*v - max).exp();
        sum += e as f64;
        *v = e;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// SiLU-gated linear unit in place on rows of `width`: `gate[i] = silu(gate[i]) · up[i]` with
/// silu(x) = x / (1 + e^−x). Shazeer 2020 (GLU variants).
///
/// llama.cpp builds it as one node, `ggml_swiglu_split(ctx, gate, up)` (llama-graph.cpp `build_ffn`,
/// `LLM_FFN_SILU` + `LLM_FFN_PAR`; `GGML_OP_GLU` / `GGML_GLU_OP_SWIGLU`), computed per row by
/// `ggml_vec_swiglu_f32`. Reference mode: libm `exp` everywhere. Ggml mode: [`ggml_cpu::swiglu_row`]
/// (`ggml_v_silu` on 16-lane blocks, `ggml_silu_f32` for the last `width % 16`).
///
/// `num.target` is the ggml-cpu build mirrored; with `num.simd` = [`Simd::Avx2`] or [`Simd::Avx512`] the ggml-mode rows run compiled with AVX2 and FMA (the
/// same bits).
pub fn swiglu(gate: &mut [f32], up: &[f32], width: usize, num: Numerics) {
    let Numerics { mode, target, simd } = num;
    for_row_chunks2(gate, up, width, |gate, up| match mode {
        NumericsMode::Reference => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
        }
        #[cfg(target_arch = "x86_64")]
        NumericsMode::Ggml
            if simd == Simd::Avx512 && target == GgmlTarget::Avx512 && simd.available() =>
        {
            // SAFETY: AVX-512 was detected on this CPU.
            unsafe { ggml_cpu::swiglu_rows_avx512(gate, up, width) }
        }
        #[cfg(target_arch = "x86_64")]
        NumericsMode::Ggml if simd.avx2_kernels() => {
            // SAFETY: AVX2 and FMA were detected on this CPU.
            unsafe { ggml_cpu::swiglu_rows_avx2(target, gate, up, width) }
        }
        NumericsMode::Ggml => {
            for (g, u) in gate.chunks_exact_mut(width).zip(up.chunks_exact(width)) {
                ggml_cpu::swiglu_row(target, g, u);
            }
        }
    })
}

/// `x += y` element-wise (`ggml_add` of two f32 tensors: one rounded addition per element, whatever the
/// SIMD width; the same in both modes).
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    // elementwise: any split gives the same bits (rows of 1024 elements for the chunking)
    for_row_chunks2(x, y, 1024.min(x.len()), |x, y| {
        for (a, &b) in x.iter_mut().zip(y) {
            *a += b;
        }
    })
}

/// Dot product of two f32 slices, accumulated in f32 left to right (reference mode).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The order in which ggml mode accumulates the KQV product `Σ_pos p[pos] · v[pos][d]` (one output per
/// head dimension `d`). llama.cpp uses both, depending on the batch:
///
/// - [`KqvOrder::TinyBlas`]: a prompt batch of ≥ 2 tokens. `ggml_compute_forward_mul_mat` (ggml-cpu.c)
///   hands `mul_mat(v, kq)` to `llamafile_sgemm` because `kq` (the softmax output) is contiguous and has
///   ≥ 2 columns: tinyBLAS<L, V> — one L-lane accumulator per output (AVX-512: 16 lanes, AVX2: 8),
///   position `i` in lane `i % L`, then the target's horizontal sum.
/// - [`KqvOrder::VecDot`]: a single-token decode step (`llamafile_sgemm` refuses `n < 2`): the vec_dot
///   path, `ggml_vec_dot_f32` over the `n_kv` positions — four L-lane accumulators (position `i` in
///   accumulator `(i / L) % 4`, lane `i % L`), reduced `(s0+s2)+(s1+s3)`, then the target's reduce.
///
/// On AVX-512 the two agree exactly while the context is ≤ 16 positions (each lane then holds a single
/// product; both end in `_mm512_reduce_add_ps`) and differ in the last bits after that; on AVX2 the final
/// reductions differ (`hsum_float_8` vs the hadd tree), so they can differ from 2 positions on. (`mul_mat(k, q)` is the same for every batch size: `q` is a
/// permuted, non-contiguous view, so tinyBLAS is never tried and every score is one `ggml_vec_dot_f32` over
/// `head_dim`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KqvOrder {
    /// llamafile tinyBLAS F32 (llama.cpp prefill, batch ≥ 2).
    TinyBlas,
    /// `ggml_vec_dot_f32` (llama.cpp decode, batch 1).
    VecDot,
}

/// The [`KqvOrder`] llama.cpp uses for a batch of `n_tokens`, and so ggml mode: tinyBLAS for a prompt batch
/// (≥ 2 tokens), vec_dot for a single-token decode step (`ggml_compute_forward_mul_mat` tries
/// `llamafile_sgemm` first, which refuses `n < 2`).
///
/// This makes ggml mode as batch-dependent as llama.cpp: a cached decode step need not equal the same
/// position inside a re-prefill (on AVX-512 the two orders agree up to 16 positions, on AVX2 their
/// reduction trees differ from the first). An earlier version used tinyBLAS for every position, to keep
/// decode equal to re-prefill; measured on the AVX2 goldens of Gemma 3 and Qwen2.5, that broke every
/// decode step from the first (`output_norm` cosine down to 0.9983 after 8 steps).
pub fn ggml_kqv_order(n_tokens: usize) -> KqvOrder {
    if n_tokens >= 2 {
        KqvOrder::TinyBlas
    } else {
        KqvOrder::VecDot
    }
}

/// Scratch length [`attention`] needs for a context of `n_pos` positions: `n_pos` rounded up to 64 (the
/// softmax row is processed in 16-lane blocks and the KQV dot in 64-element steps, with the positions past
/// the last one masked to exactly 0, as in llama.cpp's `n_kv`-wide rows, `n_kv` a multiple of 256).
pub fn attention_scratch_len(n_pos: usize) -> usize {
    n_pos.div_ceil(64) * 64
}

/// The shape and options of one attention layer (what [`attention`] needs besides the data).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads; query head `h` reads KV head `h / (n_head / n_kv_head)` (GQA, Ainslie et al. 2023).
    pub n_kv_head: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// The factor llama.cpp passes to `ggml_soft_max_ext(kq, mask, kq_scale, 0)`: 1/√head_dim for Llama and
    /// Qwen2 (Vaswani et al. 2017); 1.0 for Gemma 3, whose graph scales Q beforehand ([`scale`]).
    pub kq_scale: f32,
    /// Sliding window: a key at position `p` is visible from query position `pos` only if
    /// `pos − p < window` (llama.cpp `LLAMA_SWA_TYPE_STANDARD`, `llama_hparams::is_masked_swa`). `None`:
    /// plain causal attention.
    pub window: Option<usize>,
}

impl AttnShape {
    /// Plain causal attention with the standard 1/√head_dim scale and no window.
    pub fn causal(n_head: usize, n_kv_head: usize, head_dim: usize) -> AttnShape {
        AttnShape {
            n_head,
            n_kv_head,
            head_dim,
            kq_scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
        }
    }

    /// First key position visible from query position `pos`.
    fn first_visible(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// The KV head query head `h` reads under GQA (Ainslie et al. 2023; llama.cpp broadcasts K/V over groups of
/// `group = n_head / n_kv_head` consecutive query heads): `h / group`.
#[inline]
fn kv_head(h: usize, group: usize, n_kv_head: usize) -> usize {
    if crate::faults::is(crate::faults::Fault::GqaHeadMap) {
        return h % n_kv_head;
    }
    h / group
}

/// Causal grouped-query attention of one token against the cache.
///
/// `q`: `[n_head · head_dim]` (after RoPE) for the token at absolute position `pos`; keys and values of
/// positions `0..=pos` must already be in `cache` for `layer`. Writes `[n_head · head_dim]` into `out`.
/// `scores` is scratch of at least [`attention_scratch_len`]`(pos + 1)` floats. The scale is applied inside
/// the softmax as llama.cpp's `ggml_soft_max_ext(kq, mask, kq_scale)` does (kq·scale, then + mask; there
/// is no separate scale node). Positions outside `shape.window` are masked with −∞ like llama.cpp's SWA
/// mask.
///
/// llama.cpp's graph (`build_attn_mha`, flash attention off, F32 cache): `kq = mul_mat(k, q)` (F32 × F32,
/// accumulated in F32 — `ggml_prec_set_acc(kq, GGML_PREC_F32)` only matters on GPUs), `kq =
/// soft_max_ext(kq, mask, kq_scale, 0)`, `kqv = mul_mat(v, kq)` with the transposed V view. Reference mode:
/// [`dot_f32`], [`softmax_scaled`], sequential f32 accumulation of `p · v`. Ggml mode: every score one
/// [`ggml_cpu::vec_dot_f32`], the row softmax [`ggml_cpu::soft_max_row`] over `target`'s lanes, the KQV
/// sums in `kqv` order ([`ggml_kqv_order`] of the batch); `num.target`, `num.simd` and `kqv` are ignored
/// in reference mode (`num.simd` changes no bit in ggml mode).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    pos: usize,
    shape: &AttnShape,
    scores: &mut [f32],
    out: &mut [f32],
    num: Numerics,
    kqv: KqvOrder,
) {
    match num.mode {
        NumericsMode::Reference => attention_reference(q, cache, layer, pos, shape, scores, out),
        NumericsMode::Ggml => attention_ggml(q, cache, layer, pos, shape, scores, out, num, kqv),
    }
}

/// [`attention`] for a batch of `n` queries: `q` and `out` are `[n, n_head·head_dim]`, query `t` sits at
/// position `pos_of(t)` and sees the cache up to it; `scores` as for [`attention`] at the largest
/// position. Ggml mode computes every (query, head) pair in one parallel pass
/// ([`attention_ggml_batch`]); the results are those of [`attention`] per query, bit for bit.
#[allow(clippy::too_many_arguments)]
pub fn attention_batch(
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    n: usize,
    pos_of: impl Fn(usize) -> usize + Sync,
    shape: &AttnShape,
    scores: &mut [f32],
    out: &mut [f32],
    num: Numerics,
    kqv: KqvOrder,
) {
    let qw = shape.n_head * shape.head_dim;
    match num.mode {
        NumericsMode::Reference => {
            for t in 0..n {
                let (qt, ot) = (&q[t * qw..][..qw], &mut out[t * qw..][..qw]);
                attention_reference(qt, cache, layer, pos_of(t), shape, scores, ot);
            }
        }
        NumericsMode::Ggml => {
            attention_ggml_batch(q, cache, layer, n, pos_of, shape, scores, out, num, kqv)
        }
    }
}

/// Reference-mode [`attention`].
fn attention_reference(
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    pos: usize,
    shape: &AttnShape,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let AttnShape {
        n_head,
        n_kv_head,
        head_dim,
        kq_scale,
        ..
    } = *shape;
    let group = n_head / n_kv_head;
    let n_pos = pos + 1;
    let first = shape.first_visible(pos);
    let scores = &mut scores[..n_pos];
    for h in 0..n_head {
        let kvh = kv_head(h, group, n_kv_head);
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        let keys = cache.keys(layer, kvh, n_pos);
        for (i, (s, k)) in scores
            .iter_mut()
            .zip(keys.chunks_exact(head_dim))
            .enumerate()
        {
            *s = if i < first {
                f32::NEG_INFINITY
            } else {
                dot_f32(qh, k)
            };
        }
        softmax_scaled(scores, kq_scale);
        let oh = &mut out[h * head_dim..(h + 1) * head_dim];
        oh.fill(0.0);
        let values = cache.values(layer, kvh, n_pos);
        for (&p, v) in scores.iter().zip(values.chunks_exact(head_dim)).skip(first) {
            for (o, &vv) in oh.iter_mut().zip(v) {
                *o += p * vv;
            }
        }
    }
}

/// Ggml-mode [`attention`] with an explicit [`KqvOrder`] (the fixture tests check both orders against
/// llama.cpp's prefill and decode graphs); `num.mode` is not read (always ggml), `num.target` picks the
/// mirrored build, `num.simd` the kernels (same bits).
///
/// Per query head, as llama.cpp computes one row of its `[n_kv, n_tokens, n_head]` tensors:
/// 1. `kq[i] = ggml_vec_dot_f32(head_dim, k[i], q)` for `i ≤ pos` (`mul_mat(k, q)`, vec_dot path);
/// 2. `ggml_soft_max_ext`: `kq·scale + mask` with the mask `-inf` past `pos`, over 16-lane blocks
///    ([`ggml_cpu::soft_max_row`]); llama.cpp's row is `n_kv` wide (a multiple of 256), its blocks past
///    `pos` are all exactly 0 and add nothing, so the row is cut after the block holding `pos`;
/// 3. `kqv[d] = Σ_i p[i]·v[i][d]` in `order`, over positions rounded up to 64 with `p = 0` past `pos` (the
///    zero products leave every accumulator unchanged, as in llama.cpp's padded rows).
#[allow(clippy::too_many_arguments)]
pub fn attention_ggml(
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    pos: usize,
    shape: &AttnShape,
    scores: &mut [f32],
    out: &mut [f32],
    num: Numerics,
    order: KqvOrder,
) {
    let hd = shape.head_dim;
    let n_pad = attention_scratch_len(pos + 1);
    let run = head_run(shape);
    let heads = |h0: usize, sh: &mut [f32], oh: &mut [f32]| {
        attention_ggml_run(
            q,
            cache,
            layer,
            pos,
            shape,
            sh,
            oh,
            (h0, run),
            (num.target, order),
            num.simd,
        )
    };
    // Runs of heads in parallel once the context makes them worth a task each; every head is computed
    // by one thread in one fixed order either way, so the bits do not depend on it.
    let out = &mut out[..shape.n_head * hd];
    if (pos + 1) * shape.n_head >= PARALLEL_ATTENTION_WORK && rayon::current_num_threads() > 1 {
        out.par_chunks_mut(run * hd)
            .enumerate()
            .for_each(|(r, oh)| with_head_scratch(run * n_pad, |s| heads(r * run, s, oh)));
    } else {
        for (r, oh) in out.chunks_exact_mut(run * hd).enumerate() {
            // `scores` holds one row (`attention_scratch_len`); a run of heads takes `run` rows
            match scores.get_mut(..run * n_pad) {
                Some(s) => heads(r * run, s, oh),
                None => with_head_scratch(run * n_pad, |s| heads(r * run, s, oh)),
            }
        }
    }
}

/// Query heads per run: the heads that share one KV head, `n_head / n_kv_head`, when they are
/// neighbours (they are, but under the `GqaHeadMap` fault, which is run one head at a time).
fn head_run(shape: &AttnShape) -> usize {
    let group = shape.n_head / shape.n_kv_head;
    let grouped = (0..shape.n_head).all(|h| kv_head(h, group, shape.n_kv_head) == h / group);
    if grouped {
        group
    } else {
        1
    }
}

/// [`attention_ggml`] for a batch of `n` queries (`q`: `[n, n_head·head_dim]`, query `t` at position
/// `pos_of(t)`), `out` likewise: every (query, run of heads) pair is one task of one parallel pass,
/// instead of one pass over the heads per query (a prompt of 512 tokens was 512 small passes per layer).
/// Each head is computed by one thread in the one order of [`attention_ggml`], so the bits are the same.
#[allow(clippy::too_many_arguments)]
pub fn attention_ggml_batch(
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    n: usize,
    pos_of: impl Fn(usize) -> usize + Sync,
    shape: &AttnShape,
    scores: &mut [f32],
    out: &mut [f32],
    num: Numerics,
    order: KqvOrder,
) {
    let hd = shape.head_dim;
    let qw = shape.n_head * hd;
    assert!(
        q.len() >= n * qw && out.len() >= n * qw,
        "attention batch shapes"
    );
    let work: usize = (0..n).map(|t| (pos_of(t) + 1) * shape.n_head).sum();
    if n == 1 || work < PARALLEL_ATTENTION_WORK || rayon::current_num_threads() == 1 {
        for t in 0..n {
            let (qt, ot) = (&q[t * qw..][..qw], &mut out[t * qw..][..qw]);
            attention_ggml(qt, cache, layer, pos_of(t), shape, scores, ot, num, order);
        }
        return;
    }
    let run = head_run(shape);
    let runs = shape.n_head / run;
    out[..n * qw]
        .par_chunks_mut(run * hd)
        .enumerate()
        .for_each(|(i, oh)| {
            let (t, r) = (i / runs, i % runs);
            let pos = pos_of(t);
            let qt = &q[t * qw..][..qw];
            with_head_scratch(run * attention_scratch_len(pos + 1), |s| {
                attention_ggml_run(
                    qt,
                    cache,
                    layer,
                    pos,
                    shape,
                    s,
                    oh,
                    (r * run, run),
                    (num.target, order),
                    num.simd,
                )
            })
        });
}

/// Run `f` on this thread's softmax rows of [`HEAD_SCRATCH`], `len` long.
fn with_head_scratch(len: usize, f: impl FnOnce(&mut [f32])) {
    HEAD_SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < len {
            s.resize(len, 0.0);
        }
        f(&mut s[..len])
    })
}

/// Query heads `h0 .. h0 + run` of [`attention_ggml`] ([`attention_run`]; `sh`: their softmax rows,
/// `run · attention_scratch_len(pos + 1)`; `oh`: their `run · head_dim` outputs), with the AVX2 kernels
/// where `simd` has them.
#[allow(clippy::too_many_arguments)]
fn attention_ggml_run(
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    pos: usize,
    shape: &AttnShape,
    sh: &mut [f32],
    oh: &mut [f32],
    heads: (usize, usize),
    (target, order): (GgmlTarget, KqvOrder),
    simd: Simd,
) {
    // the thread's KQV accumulators, taken here: a closure inside the target-feature function would be
    // compiled without its features
    KQV_ACC.with(|acc| {
        let acc = &mut acc.borrow_mut();
        let to = (target, order);
        if simd == Simd::Avx512 && simd.available() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `available` is true only where AVX2, FMA and AVX-512 were detected on this CPU.
            unsafe {
                attention_run_avx512(q, cache, layer, pos, shape, sh, oh, heads, to, acc);
            }
        } else if simd.avx2_kernels() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `avx2_kernels` is true only where AVX2 and FMA were detected on this CPU.
            unsafe {
                attention_run_avx2(q, cache, layer, pos, shape, sh, oh, heads, to, acc);
            }
        } else {
            let kq = |keys: &[f32], q: &[f32], s: &mut [f32]| {
                for (s, k) in s.iter_mut().zip(keys.chunks_exact(q.len())) {
                    *s = ggml_cpu::vec_dot_f32(target, k, q);
                }
            };
            attention_run::<Emulated, _>(q, cache, layer, pos, shape, sh, oh, heads, to, acc, kq);
        }
    })
}

/// Positions × heads above which [`attention_ggml`] splits heads across threads.
const PARALLEL_ATTENTION_WORK: usize = 256;

thread_local! {
    /// Per-thread softmax rows of the parallel heads (grows once, then reused: no allocation per token).
    static HEAD_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`attention_run`] compiled with AVX2 and FMA: the same steps, `F` = [`Hardware`], so the lane loops
/// vectorize and every fma is one instruction (the same bits as [`Emulated`]).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attention_run_avx2(
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    pos: usize,
    shape: &AttnShape,
    scores: &mut [f32],
    out: &mut [f32],
    heads: (usize, usize),
    to: (GgmlTarget, KqvOrder),
    acc: &mut Vec<f32>,
) {
    // SAFETY: the caller's CPU has AVX2 and FMA (this function's own contract).
    let kq =
        |k: &[f32], q: &[f32], s: &mut [f32]| unsafe { ggml_cpu::kq_scores_avx2(to.0, k, q, s) };
    attention_run::<Hardware, _>(q, cache, layer, pos, shape, scores, out, heads, to, acc, kq)
}

/// [`attention_run_avx2`] compiled with AVX-512 F and VL as well (the KQ scores of
/// [`ggml_cpu::kq_scores_avx512`]: 32 vector registers); the same bits.
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512 F and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn attention_run_avx512(
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    pos: usize,
    shape: &AttnShape,
    scores: &mut [f32],
    out: &mut [f32],
    heads: (usize, usize),
    to: (GgmlTarget, KqvOrder),
    acc: &mut Vec<f32>,
) {
    // SAFETY: the caller's CPU has AVX2, FMA and AVX-512 F/VL (this function's own contract).
    let kq =
        |k: &[f32], q: &[f32], s: &mut [f32]| unsafe { ggml_cpu::kq_scores_avx512(to.0, k, q, s) };
    attention_run::<HardwareAvx512, _>(q, cache, layer, pos, shape, scores, out, heads, to, acc, kq)
}

/// Largest head dimension [`kqv_all_d`] takes (larger heads use the per-output dot products).
const MAX_KQV_HEAD_DIM: usize = 256;

thread_local! {
    /// Per-thread accumulators of [`kqv_all_d`] (grow once, then reused).
    static KQV_ACC: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Query heads `h0 .. h0 + run` of [`attention_ggml`], which share one KV head: `scores` is their
/// scratch (`run` rows of `attention_scratch_len(pos+1)`), `out` their `run · head_dim` outputs;
/// `kq(keys, q, scores)` computes the KQ score of every key row as `ggml_vec_dot_f32(k, q)` does for
/// `target`. Each head is computed as llama.cpp computes its row; the run only lets [`kqv_all_d`] read
/// V once for several heads.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attention_run<F: Fma, K: Fn(&[f32], &[f32], &mut [f32])>(
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    pos: usize,
    shape: &AttnShape,
    scores: &mut [f32],
    out: &mut [f32],
    (h0, run): (usize, usize),
    (target, order): (GgmlTarget, KqvOrder),
    acc: &mut Vec<f32>,
    kq: K,
) {
    let AttnShape {
        n_head,
        n_kv_head,
        head_dim,
        kq_scale: scale,
        ..
    } = *shape;
    let group = n_head / n_kv_head;
    let n_pos = pos + 1;
    let first = shape.first_visible(pos);
    let n_row = n_pos.div_ceil(ggml_cpu::LANES) * ggml_cpu::LANES;
    let n_pad = attention_scratch_len(n_pos);
    let kvh = kv_head(h0, group, n_kv_head);
    let keys = cache.keys(layer, kvh, n_pos);
    for (j, scores) in scores.chunks_exact_mut(n_pad).take(run).enumerate() {
        let h = h0 + j;
        debug_assert_eq!(
            kv_head(h, group, n_kv_head),
            kvh,
            "a run shares its KV head"
        );
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        // every score `ggml_vec_dot_f32(k, q)` for the target (vec_dot_f32, or its AVX2 form)
        kq(keys, qh, &mut scores[..n_pos]);
        // masked positions: kq·scale + (−∞) = −∞, exp → exactly 0 (outside the window and past `pos`)
        scores[..first].fill(f32::NEG_INFINITY);
        scores[n_pos..n_row].fill(f32::NEG_INFINITY);
        ggml_cpu::soft_max_row_f::<F>(target, &mut scores[..n_row], None, scale);
        scores[n_row..].fill(0.0);
    }
    let values = cache.values(layer, kvh, n_pos);
    let k = match order {
        KqvOrder::TinyBlas => n_row,
        KqvOrder::VecDot => n_pad,
    };
    let whole = match order {
        KqvOrder::VecDot => k % (4 * target.lanes()) == 0,
        KqvOrder::TinyBlas => k % target.lanes() == 0,
    };
    if head_dim <= MAX_KQV_HEAD_DIM && whole {
        let ps = (&scores[..], n_pad, k);
        kqv_all_d::<F>(target, order, values, n_pos, head_dim, ps, run, out, acc);
        return;
    }
    let v = |i: usize, d: usize| {
        if i < n_pos {
            values[i * head_dim + d]
        } else {
            0.0
        }
    };
    for (scores, out) in scores
        .chunks_exact(n_pad)
        .zip(out.chunks_exact_mut(head_dim))
    {
        for (d, o) in out.iter_mut().enumerate() {
            *o = match order {
                KqvOrder::TinyBlas => {
                    ggml_cpu::tinyblas_dot_f32_by::<F>(target, k, |i| v(i, d), scores)
                }
                KqvOrder::VecDot => ggml_cpu::vec_dot_f32_by::<F>(target, k, |i| v(i, d), scores),
            };
        }
    }
}

/// [`kqv_all_d`]'s reductions for dimensions `d0 .. d0 + 8` at once: per dimension exactly the adds of
/// [`GgmlTarget::vec_reduce`] ([`KqvOrder::VecDot`]) or of the target's horizontal sum
/// ([`KqvOrder::TinyBlas`]: AVX2 `hsum_float_8`, AVX-512 `_mm512_reduce_add_ps`), element-wise on
/// eight-wide arrays (which vectorize) instead of one dimension after another.
#[inline(always)]
fn kqv_reduce8(target: GgmlTarget, order: KqvOrder, acc: &[f32], hd: usize, d0: usize) -> [f32; 8] {
    type V = [f32; 8];
    let lanes = target.lanes();
    let ld = |j: usize, l: usize| -> V {
        let s = &acc[(j * lanes + l) * hd + d0..][..8];
        std::array::from_fn(|i| s[i])
    };
    let add = |a: V, b: V| -> V { std::array::from_fn(|i| a[i] + b[i]) };
    let mut r = [[0f32; 8]; ggml_cpu::LANES];
    for (l, r) in r[..lanes].iter_mut().enumerate() {
        *r = match order {
            // (s0 + s2) + (s1 + s3)
            KqvOrder::VecDot => add(add(ld(0, l), ld(2, l)), add(ld(1, l), ld(3, l))),
            KqvOrder::TinyBlas => ld(0, l),
        };
    }
    match (target, order) {
        // _mm512_reduce_add_ps: 16 → 8 (high + low) → 4 → (0 + 2) + (1 + 3)
        (GgmlTarget::Avx512, _) => {
            let t8: [V; 8] = std::array::from_fn(|i| add(r[8 + i], r[i]));
            let t4: [V; 4] = std::array::from_fn(|i| add(t8[4 + i], t8[i]));
            add(add(t4[0], t4[2]), add(t4[1], t4[3]))
        }
        // GGML_F32x8_REDUCE: halves, then two hadds: (t0 + t1) + (t2 + t3)
        (GgmlTarget::Avx2, KqvOrder::VecDot) => {
            let t: [V; 4] = std::array::from_fn(|i| add(r[i], r[i + 4]));
            add(add(t[0], t[1]), add(t[2], t[3]))
        }
        // hsum_float_8: (a4 + a0, a5 + a1, a6 + a2, a7 + a3), then (r0 + r2) + (r1 + r3)
        (GgmlTarget::Avx2, KqvOrder::TinyBlas) => {
            let t: [V; 4] = std::array::from_fn(|i| add(r[4 + i], r[i]));
            add(add(t[0], t[2]), add(t[1], t[3]))
        }
    }
}

/// Head dimensions [`kqv_slot`] keeps in registers at once (eight 8-lane vectors: eight independent fma
/// chains, enough to cover the fma latency).
const KQV_DIMS: usize = 64;

/// Accumulator `a` of [`kqv_all_d`] for dimensions `d0 .. d0 + D` (the scalar walk; the AVX2 kernel is
/// `ggml_cpu::kqv_heads_avx2`): `acc[k] = fma(v[i][d0 + k], p[i], acc[k])` for `i = a, a + n_acc, ...`
/// below `p.len()` (rows past `n_pos` are zeros), from 0.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn kqv_slot<F: Fma, const D: usize>(
    values: &[f32],
    n_pos: usize,
    hd: usize,
    p: &[f32],
    a: usize,
    n_acc: usize,
    d0: usize,
    out: &mut [f32],
) {
    let mut r = [0f32; D];
    let mut i = a;
    while i < p.len() {
        let pi = p[i];
        if i < n_pos {
            let row = &values[i * hd + d0..][..D];
            for (r, &v) in r.iter_mut().zip(row) {
                *r = F::fma(v, pi, *r);
            }
        } else {
            for r in r.iter_mut() {
                *r = F::fma(0.0, pi, *r);
            }
        }
        i += n_acc;
    }
    out[..D].copy_from_slice(&r);
}

/// `out[j·hd + d] = Σ_i p_j[i]·v[i][d]` for every head `j < run` of a run sharing one KV head and every
/// `d` at once (`p_j = ps[j·stride ..][..p_len]`), each output with exactly the operations of
/// `vec_dot_f32_by` ([`KqvOrder::VecDot`], `p_len` a multiple of 4 lanes) or `tinyblas_dot_f32_by`
/// ([`KqvOrder::TinyBlas`], a multiple of the lanes): the accumulators of every `d` advance together over
/// the contiguous rows of `v` (rows `≥ n_pos` are zeros, as in llama.cpp's padded view), so the inner
/// loop runs over `d` and vectorizes, while each output still sees the same fmas in the same order as
/// the strided per-`d` dot product. Then each `d` is reduced as its kernel reduces. The AVX2 kernel reads
/// each row of `v` once for up to three heads of the run (V was read once per head: a prompt's attention
/// was bound by the reads of V from L2).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn kqv_all_d<F: Fma>(
    target: GgmlTarget,
    order: KqvOrder,
    values: &[f32],
    n_pos: usize,
    hd: usize,
    (ps, stride, p_len): (&[f32], usize, usize),
    run: usize,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    let lanes = target.lanes();
    let n_acc = match order {
        KqvOrder::VecDot => 4 * lanes,
        KqvOrder::TinyBlas => lanes,
    };
    debug_assert!(hd <= MAX_KQV_HEAD_DIM && p_len.is_multiple_of(n_acc));
    assert!(run >= 1 && ps.len() >= (run - 1) * stride + p_len && out.len() >= run * hd);
    let per = n_acc * hd;
    if scratch.len() < run * per {
        scratch.resize(run * per, 0.0);
    }
    let acc = &mut scratch[..run * per];
    // VecDot: element i + j·L + l of every 4L-step goes to accumulator (j, l); TinyBlas: i + l to l —
    // accumulator `a` takes positions a, a + n_acc, a + 2·n_acc, ... in that order.
    let mut done = false;
    #[cfg(target_arch = "x86_64")]
    if F::AVX2 && n_acc.is_multiple_of(4) && hd.is_multiple_of(8) {
        let mut j0 = 0;
        while j0 < run {
            let h = (run - j0).min(ggml_cpu::KQV_HEADS);
            let p = &ps[j0 * stride..];
            let a = &mut acc[j0 * per..];
            let p = (p, stride, p_len);
            if F::AVX512 && hd == 64 {
                // SAFETY: `F::AVX512` holds only where the CPU has AVX2, FMA and AVX-512 F/VL
                unsafe { ggml_cpu::kqv_heads64_avx512(h, values, n_pos, p, n_acc, a) };
            } else {
                // SAFETY: `F::AVX2` holds only where the CPU has AVX2 and FMA (`Fma::AVX2`)
                unsafe { ggml_cpu::kqv_heads_avx2(h, values, n_pos, hd, p, n_acc, a) };
            }
            j0 += h;
        }
        done = true;
    }
    if !done {
        for (j, acc) in acc.chunks_exact_mut(per).enumerate() {
            let p = &ps[j * stride..][..p_len];
            for (a, acc) in acc.chunks_exact_mut(hd).enumerate() {
                let mut d0 = 0;
                while d0 + KQV_DIMS <= hd {
                    kqv_slot::<F, KQV_DIMS>(values, n_pos, hd, p, a, n_acc, d0, &mut acc[d0..]);
                    d0 += KQV_DIMS;
                }
                while d0 < hd {
                    kqv_slot::<F, 1>(values, n_pos, hd, p, a, n_acc, d0, &mut acc[d0..]);
                    d0 += 1;
                }
            }
        }
    }
    for (acc, out) in acc.chunks_exact(per).zip(out.chunks_exact_mut(hd)) {
        // eight dimensions at a time: the same trees with the dimensions as the lanes of one vector
        let mut d0 = 0;
        while d0 + 8 <= hd {
            out[d0..d0 + 8].copy_from_slice(&kqv_reduce8(target, order, acc, hd, d0));
            d0 += 8;
        }
        for (d, o) in out[..hd].iter_mut().enumerate().skip(d0) {
            let lane = |j: usize, l: usize| acc[(j * lanes + l) * hd + d];
            *o = match order {
                // ggml_vec_dot_f32's reduction (GGML_F32_VEC_REDUCE)
                KqvOrder::VecDot => target.vec_reduce(lane),
                // tinyBLAS's hsum of its single accumulator
                KqvOrder::TinyBlas => {
                    let mut r = [0f32; ggml_cpu::LANES];
                    for (l, r) in r[..lanes].iter_mut().enumerate() {
                        *r = lane(0, l);
                    }
                    target.hsum_vec(&r[..lanes])
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::GgmlTarget;

    /// Ggml mode mirroring `target` with the kernels of `simd`.
    fn ggml(target: GgmlTarget, simd: Simd) -> Numerics {
        Numerics::ggml(target).with_simd(simd)
    }

    const MODES: [NumericsMode; 2] = [NumericsMode::Reference, NumericsMode::Ggml];

    #[test]
    fn rms_norm_unit_rms() {
        let mut x = vec![3.0, -4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        rms_norm(&mut x, &[1.0; 4], 0.0);
        // row 1: rms = sqrt(25/4) = 2.5
        assert!((x[0] - 1.2).abs() < 1e-6 && (x[1] + 1.6).abs() < 1e-6);
        assert_eq!(&x[4..], &[1.0; 4]);
    }

    #[test]
    fn softmax_all_masked_is_zero_not_nan() {
        let mut x = vec![f32::NEG_INFINITY; 3];
        softmax_scaled(&mut x, 0.5);
        assert_eq!(x, vec![0.0; 3]);
        let mut y = vec![1.0, 2.0, f32::NEG_INFINITY];
        softmax_scaled(&mut y, 1.0);
        assert!((y.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(y[2], 0.0);
    }

    #[test]
    fn rope_position_zero_is_identity_and_rotation_preserves_norm() {
        for mode in MODES {
            let mut c = vec![0.0; 4];
            rope_cache(0, 10000.0, 4, &mut c);
            let mut x = vec![1.0, 2.0, 3.0, 4.0];
            rope_norm(&mut x, 4, 4, &c, mode);
            assert_eq!(x, vec![1.0, 2.0, 3.0, 4.0]);
            rope_cache(5, 10000.0, 4, &mut c);
            rope_norm(&mut x, 4, 4, &c, mode);
            let n: f32 = x.iter().map(|v| v * v).sum();
            assert!((n - 30.0).abs() < 1e-4);
            // pair 0 rotated by θ = 5 rad
            assert!((x[0] - (5f32.cos() - 2.0 * 5f32.sin())).abs() < 1e-5);
        }
    }

    #[test]
    fn simd_rope_gives_the_scalar_bits() {
        if !Simd::Avx2.available() {
            eprintln!("skipping: no AVX2+FMA on this CPU");
            return;
        }
        let (hd, rd) = (64, 48);
        let x: Vec<f32> = (0..9 * hd)
            .map(|i| (i as f32 * 0.77).sin() * 10f32.powi(i as i32 % 7 - 3))
            .collect();
        for pos in [0, 1, 17, 500, 30_000] {
            let mut c = vec![0.0; rd];
            rope_cache(pos, 10_000.0, rd, &mut c);
            type Rope = fn(&mut [f32], usize, usize, &[f32], Numerics);
            for rope in [rope_norm_simd as Rope, rope_neox_simd] {
                let (mut a, mut b) = (x.clone(), x.clone());
                rope(&mut a, hd, rd, &c, Numerics::new(NumericsMode::Ggml));
                rope(
                    &mut b,
                    hd,
                    rd,
                    &c,
                    Numerics::new(NumericsMode::Ggml).with_simd(Simd::Avx2),
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "pos {pos}");
                if pos > 0 {
                    assert_ne!(bits(&a), bits(&x), "pos {pos}: rotated");
                }
            }
        }
    }

    #[test]
    fn swiglu_modes_agree_closely() {
        let gate: Vec<f32> = (0..70).map(|i| (i as f32 * 0.61).sin() * 6.0).collect();
        let up: Vec<f32> = (0..70).map(|i| (i as f32 * 0.23).cos()).collect();
        for t in GgmlTarget::ALL {
            let (mut a, mut b) = (gate.clone(), gate.clone());
            swiglu(
                &mut a,
                &up,
                35,
                Numerics {
                    mode: NumericsMode::Reference,
                    target: t,
                    simd: Simd::Off,
                },
            );
            swiglu(
                &mut b,
                &up,
                35,
                Numerics {
                    mode: NumericsMode::Ggml,
                    target: t,
                    simd: Simd::Off,
                },
            );
            if Simd::Avx2.available() {
                // the SIMD rows give the scalar replica's bits, with large, tiny and infinite inputs too
                let mut wide: Vec<f32> =
                    (0..4000).map(|i| (i as f32 * 0.37).sin() * 120.0).collect();
                wide[17] = f32::INFINITY;
                wide[18] = f32::NEG_INFINITY;
                wide[19] = 1e-40;
                let up: Vec<f32> = (0..4000).map(|i| (i as f32 * 0.11).cos()).collect();
                let mut c = wide.clone();
                swiglu(
                    &mut c,
                    &up,
                    1000,
                    Numerics {
                        mode: NumericsMode::Ggml,
                        target: t,
                        simd: Simd::Off,
                    },
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                // rows of 1000 leave a tail of 8 past the sixteen-lane vectors (AVX-512's own loop)
                for simd in [Simd::Avx2, Simd::Avx512] {
                    if simd.available() {
                        let mut d = wide.clone();
                        swiglu(
                            &mut d,
                            &up,
                            1000,
                            Numerics {
                                mode: NumericsMode::Ggml,
                                target: t,
                                simd: simd,
                            },
                        );
                        assert_eq!(bits(&c), bits(&d), "{t} {simd:?}");
                    }
                }
            }
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() <= 4.0 * f32::EPSILON * x.abs().max(1e-30),
                    "{t}: {x} vs {y}"
                );
            }
        }
    }

    #[test]
    fn a_batch_of_queries_gives_the_bits_of_one_query_at_a_time() {
        // attention_ggml_batch runs every (query, run of heads) pair as one task of one parallel pass;
        // each output must be the one attention_ggml computes for that query alone
        let mut s = 0x0bad_cafe_1234_5678u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 6.0
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for (n_head, n_kv, hd) in [(9, 3, 64), (4, 1, 256), (14, 2, 64)] {
            let (p0, n) = (5, 70);
            let mut cache = KvCache::new(1, n_kv, hd, p0 + n);
            for p in 0..p0 + n {
                let k: Vec<f32> = (0..n_kv * hd).map(|_| rnd()).collect();
                let v: Vec<f32> = (0..n_kv * hd).map(|_| rnd()).collect();
                cache.write(0, p, &k, &v).unwrap();
            }
            let qw = n_head * hd;
            let q: Vec<f32> = (0..n * qw).map(|_| rnd()).collect();
            let shape = AttnShape::causal(n_head, n_kv, hd);
            for simd in [Simd::Off, Simd::Avx2]
                .into_iter()
                .filter(|s| s.available())
            {
                let to = KqvOrder::TinyBlas;
                let mut scores = vec![0.0; attention_scratch_len(p0 + n)];
                let mut batch = vec![0.0; n * qw];
                pool.install(|| {
                    let (sc, b) = (&mut scores, &mut batch);
                    attention_ggml_batch(
                        &q,
                        &cache,
                        0,
                        n,
                        |t| p0 + t,
                        &shape,
                        sc,
                        b,
                        ggml(GgmlTarget::Avx512, simd),
                        to,
                    )
                });
                for t in 0..n {
                    let mut one = vec![0.0; qw];
                    let qt = &q[t * qw..][..qw];
                    attention_ggml(
                        qt,
                        &cache,
                        0,
                        p0 + t,
                        &shape,
                        &mut scores,
                        &mut one,
                        ggml(GgmlTarget::Avx512, simd),
                        to,
                    );
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&batch[t * qw..][..qw]),
                        bits(&one),
                        "{n_head}x{hd} query {t} {simd:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn simd_attention_gives_the_scalar_bits_for_every_target_order_and_shape() {
        if !Simd::Avx2.available() {
            eprintln!("skipping: no AVX2+FMA on this CPU");
            return;
        }
        let mut s = 0x1234_5678_9abc_def1u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 6.0
        };
        let mut cases = 0;
        for (n_head, n_kv, hd) in [(9, 3, 64), (4, 1, 256), (2, 2, 8), (14, 2, 64), (3, 1, 300)] {
            let n = 300;
            let mut cache = KvCache::new(1, n_kv, hd, n);
            for p in 0..n {
                let k: Vec<f32> = (0..n_kv * hd).map(|_| rnd()).collect();
                let v: Vec<f32> = (0..n_kv * hd).map(|_| rnd()).collect();
                cache.write(0, p, &k, &v).unwrap();
            }
            let q: Vec<f32> = (0..n_head * hd).map(|_| rnd()).collect();
            let mut scores = vec![0.0; attention_scratch_len(n)];
            for pos in [0, 1, 15, 16, 17, 63, 64, 100, 255, 299] {
                for window in [None, Some(7)] {
                    let shape = AttnShape {
                        window,
                        ..AttnShape::causal(n_head, n_kv, hd)
                    };
                    for target in GgmlTarget::ALL {
                        for order in [KqvOrder::VecDot, KqvOrder::TinyBlas] {
                            let run = |simd: Simd, scores: &mut Vec<f32>| {
                                let mut out = vec![0.0; n_head * hd];
                                let num = ggml(target, simd);
                                attention_ggml(
                                    &q, &cache, 0, pos, &shape, scores, &mut out, num, order,
                                );
                                out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
                            };
                            let scalar = run(Simd::Off, &mut scores);
                            // the AVX2 kernels, and where this CPU has them the AVX-512 ones
                            // (32-register KQ and 64-wide KQV)
                            for simd in [Simd::Avx2, Simd::Avx512] {
                                if simd.available() {
                                    assert_eq!(
                                        scalar,
                                        run(simd, &mut scores),
                                        "{simd:?} {n_head}x{hd} pos {pos} {window:?} {target} \
                                         {order:?}"
                                    );
                                }
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 5 * 10 * 2 * 2 * 2);
    }

    #[test]
    fn kqv_for_every_output_at_once_equals_the_per_output_ggml_dot_products() {
        // kqv_all_d claims each output sees exactly the operations of ggml_vec_dot_f32 (decode) or of
        // tinyBLAS (prompt batch) over a strided V column: hold it to those replicas, for every target,
        // bit for bit (the AVX2 reductions of the two kernels differ in their order)
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        };
        let mut acc = Vec::new();
        for hd in [8, 64, 256] {
            for n_pos in [1, 17, 64, 100] {
                let values: Vec<f32> = (0..n_pos * hd).map(|_| rnd()).collect();
                let v = |i: usize, d: usize| if i < n_pos { values[i * hd + d] } else { 0.0 };
                for target in GgmlTarget::ALL {
                    for order in [KqvOrder::VecDot, KqvOrder::TinyBlas] {
                        let k = match order {
                            KqvOrder::VecDot => attention_scratch_len(n_pos),
                            KqvOrder::TinyBlas => n_pos.div_ceil(ggml_cpu::LANES) * ggml_cpu::LANES,
                        };
                        let p: Vec<f32> = (0..k)
                            .map(|i| if i < n_pos { rnd().abs() } else { 0.0 })
                            .collect();
                        let mut out = vec![0.0; hd];
                        kqv_all_d::<Emulated>(
                            target,
                            order,
                            &values,
                            n_pos,
                            hd,
                            (&p, k, k),
                            1,
                            &mut out,
                            &mut acc,
                        );
                        for (d, &o) in out.iter().enumerate() {
                            let want = match order {
                                KqvOrder::VecDot => {
                                    ggml_cpu::vec_dot_f32_by::<Emulated>(target, k, |i| v(i, d), &p)
                                }
                                KqvOrder::TinyBlas => ggml_cpu::tinyblas_dot_f32_by::<Emulated>(
                                    target,
                                    k,
                                    |i| v(i, d),
                                    &p,
                                ),
                            };
                            assert_eq!(
                                o.to_bits(),
                                want.to_bits(),
                                "hd {hd} n_pos {n_pos} {target} {order:?} d {d}: {o} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn attention_single_position_returns_value() {
        for mode in MODES {
            let mut cache = KvCache::new(1, 1, 2, 4);
            cache.write(0, 0, &[1.0, 0.0], &[5.0, 6.0]).unwrap();
            let mut out = vec![0.0; 4];
            let mut scores = vec![0.0; attention_scratch_len(1)];
            // two query heads share one kv head
            attention(
                &[1.0, 1.0, -1.0, 2.0],
                &cache,
                0,
                0,
                &AttnShape::causal(2, 1, 2),
                &mut scores,
                &mut out,
                Numerics {
                    mode: mode,
                    target: GgmlTarget::Avx2,
                    simd: Simd::Off,
                },
                KqvOrder::VecDot,
            );
            assert_eq!(out, vec![5.0, 6.0, 5.0, 6.0]);
        }
    }

    #[test]
    fn sliding_window_sees_only_the_last_window_positions() {
        // values are one-hot per position; a query equal to every key gives equal weights to the visible
        // positions, so the output is the mean of their one-hot vectors
        let (hd, n) = (8, 8);
        let mut cache = KvCache::new(1, 1, hd, n);
        for p in 0..n {
            let mut v = vec![0.0; hd];
            v[p] = 1.0;
            cache.write(0, p, &[0.0; 8], &v).unwrap();
        }
        for mode in MODES {
            for (window, first) in [(None, 0), (Some(3), 5), (Some(1), 7), (Some(100), 0)] {
                let shape = AttnShape {
                    window,
                    ..AttnShape::causal(1, 1, hd)
                };
                let mut out = vec![0.0; hd];
                let mut scores = vec![0.0; attention_scratch_len(n)];
                let q = [0.0; 8];
                attention(
                    &q,
                    &cache,
                    0,
                    7,
                    &shape,
                    &mut scores,
                    &mut out,
                    Numerics {
                        mode: mode,
                        target: GgmlTarget::Avx512,
                        simd: Simd::Off,
                    },
                    KqvOrder::VecDot,
                );
                let w = 1.0 / (n - first) as f32;
                for (p, &o) in out.iter().enumerate() {
                    let want = if p >= first { w } else { 0.0 };
                    assert!(
                        (o - want).abs() < 1e-6,
                        "{mode:?} {window:?} pos {p}: {o} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn rope_neox_pairs_halves_and_matches_norm_on_permuted_input() {
        // NeoX on [a0..a(h-1), b0..b(h-1)] equals NORM on the interleaved [a0, b0, a1, b1, ...]
        let (hd, rd) = (8, 8);
        let x: Vec<f32> = (0..hd).map(|i| i as f32 * 0.3 - 1.0).collect();
        let mut c = vec![0.0; rd];
        rope_cache(11, 10000.0, rd, &mut c);
        for mode in MODES {
            let mut neox = x.clone();
            rope_neox(&mut neox, hd, rd, &c, mode);
            let mut inter: Vec<f32> = (0..hd / 2).flat_map(|i| [x[i], x[i + hd / 2]]).collect();
            rope_norm(&mut inter, hd, rd, &c, mode);
            let back: Vec<f32> = (0..hd)
                .map(|i| {
                    if i < hd / 2 {
                        inter[2 * i]
                    } else {
                        inter[2 * (i - hd / 2) + 1]
                    }
                })
                .collect();
            assert_eq!(neox, back, "{mode:?}");
        }
    }

    #[test]
    fn ggml_attention_orders_agree_up_to_16_positions_then_differ() {
        let (hd, n) = (8, 80);
        let mut cache = KvCache::new(1, 1, hd, n);
        let val = |i: usize, s: f32| ((i as f32 * s).sin() * 3.0) + 0.1;
        for p in 0..n {
            let k: Vec<f32> = (0..hd).map(|d| val(p * hd + d, 0.37)).collect();
            let v: Vec<f32> = (0..hd).map(|d| val(p * hd + d, 0.91)).collect();
            cache.write(0, p, &k, &v).unwrap();
        }
        let q: Vec<f32> = (0..hd).map(|d| val(d, 1.3)).collect();
        let mut scores = vec![0.0; attention_scratch_len(n)];
        let mut differ = 0;
        for pos in 0..n {
            let mut a = vec![0.0; hd];
            let mut b = vec![0.0; hd];
            attention_ggml(
                &q,
                &cache,
                0,
                pos,
                &AttnShape::causal(1, 1, hd),
                &mut scores,
                &mut a,
                ggml(GgmlTarget::Avx512, Simd::Off),
                KqvOrder::TinyBlas,
            );
            attention_ggml(
                &q,
                &cache,
                0,
                pos,
                &AttnShape::causal(1, 1, hd),
                &mut scores,
                &mut b,
                ggml(GgmlTarget::Avx512, Simd::Off),
                KqvOrder::VecDot,
            );
            if pos < 16 {
                assert_eq!(a, b, "pos {pos}");
            } else if a != b {
                differ += 1;
            }
            let mut r = vec![0.0; hd];
            attention(
                &q,
                &cache,
                0,
                pos,
                &AttnShape::causal(1, 1, hd),
                &mut scores,
                &mut r,
                Numerics {
                    mode: NumericsMode::Reference,
                    target: GgmlTarget::Avx512,
                    simd: Simd::Off,
                },
                KqvOrder::TinyBlas,
            );
            for (x, y) in a.iter().zip(&r) {
                assert!(
                    (x - y).abs() < 1e-5 * (1.0 + y.abs()),
                    "pos {pos}: {x} vs {y}"
                );
            }
        }
        assert!(differ > 0, "the two accumulation orders never differed");
    }
}
