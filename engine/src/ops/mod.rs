//! Shared numeric blocks of transformer forward passes: RMSNorm, RoPE (NORM and NeoX), softmax, SiLU- and
//! GELU-gated units and causal (optionally sliding-window) grouped-query attention over the KV cache.
//!
//! Activations are row-major `[n_tokens, width]` f32 slices. Ops whose arithmetic differs between the two
//! numerics modes take a [`NumericsMode`]:
//!
//! - **reference**: plain f32 math (libm `exp`, left-to-right f32 dot products) — the formulas as written;
//! - **ggml**: what llama.cpp's CPU backend computes on the golden's host, bit for bit: the AVX2 or AVX-512
//!   kernels of ggml-cpu ([`GgmlTarget`](crate::numerics::GgmlTarget)) replicated lane by lane in
//!   [`ggml_cpu`] (polynomial `exp` in SiLU and softmax, 8- or 16-lane accumulators and reduction trees in
//!   the attention dot products, the fmas gcc contracted in RoPE).
//!
//! | op | ggml function mirrored (both modes follow its order of operations; ggml mode also its SIMD) |
//! |---|---|
//! | [`rms_norm`] | `ggml_compute_forward_rms_norm_f32` (+ `ggml_mul`, fused on CPU) — same in both modes |
//! | [`layer_norm`] | `ggml_compute_forward_norm_f32` + `ggml_mul` + `ggml_add`; ggml mode: the variance's lane blocks |
//! | [`gelu`] | `ggml_vec_gelu_f32` (`GGML_OP_UNARY` / `GELU`); ggml mode: the f16 GELU table |
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

mod attention;
pub mod ggml_cpu;

pub use attention::{
    attention, attention_batch, attention_cross, attention_ggml, attention_ggml_batch,
    attention_no_cache, attention_scratch_len, ggml_kqv_order, AttnShape, KqvOrder,
};

use crate::numerics::{Numerics, NumericsMode, Simd};
use crate::workers;

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

/// LayerNorm in place on every row of `x` (`[n_rows, width]`), then `· weight` and `+ bias` (Ba et al.
/// 2016): llama.cpp `build_norm(.., LLM_NORM, ..)` = `ggml_norm` (eps inside the square root), `ggml_mul`,
/// `ggml_add` — three nodes, each one rounding per element: `y = ((x − mean)·scale)·w + b`.
///
/// The mean is an f64 sum of the row rounded to f32 and divided in f32 (`ggml_vec_sum_f32`) in both modes.
/// Reference mode sums the squared deviations in f64 one f32 square at a time, left to right; ggml mode
/// as `ggml_vec_cvar_f32` for `num.target` ([`ggml_cpu::norm_row`]: f32 lane blocks reduced by the target's
/// tree, each block added in f64). `bias` is `None` when the fault `LayerNormBiasDropped` drops it.
pub fn layer_norm(x: &mut [f32], weight: &[f32], bias: Option<&[f32]>, eps: f32, num: Numerics) {
    let width = weight.len();
    for_row_chunks(x, width, |rows| {
        for row in rows.chunks_exact_mut(width) {
            match num.mode {
                NumericsMode::Reference => {
                    let sum: f64 = row.iter().map(|&v| v as f64).sum();
                    let mean = (sum as f32) / width as f32;
                    let mut acc = 0f64;
                    for v in row.iter_mut() {
                        *v -= mean;
                        acc += (*v * *v) as f64;
                    }
                    let var = (acc / width as f64) as f32;
                    let scale = 1.0f32 / (var + eps).sqrt();
                    row.iter_mut().for_each(|v| *v *= scale);
                }
                NumericsMode::Ggml => ggml_cpu::norm_row(num.target, row, eps),
            }
            for (v, &w) in row.iter_mut().zip(weight) {
                *v *= w;
            }
            if let Some(b) = bias {
                row.iter_mut().zip(b).for_each(|(v, &b)| *v += b);
            }
        }
    });
}

/// Elements per task of the row-wise ops of a prompt batch ([`for_row_chunks`]): rows are gathered
/// until a chunk holds about this many, so that a task is worth its scheduling.
const PAR_CHUNK_ELEMS: usize = 16 * 1024;

/// `f` on consecutive chunks of whole rows of `x` (`[n_rows, width]`), in parallel on the engine's
/// workers ([`workers::for_each_chunk_mut`]) when `x` holds more than one chunk of [`PAR_CHUNK_ELEMS`]
/// (a prompt batch), else in one call on this thread (a decode step: no task, no allocation). For ops that treat each row on its own, so the split never changes a
/// bit.
pub(crate) fn for_row_chunks(x: &mut [f32], width: usize, f: impl Fn(&mut [f32]) + Sync) {
    let rows_per = (PAR_CHUNK_ELEMS / width.max(1)).max(1);
    if width == 0 || x.len() <= rows_per * width || workers::threads() == 1 {
        f(x);
    } else {
        workers::for_each_chunk_mut(x, rows_per * width, |_, c| f(c));
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
    if width == 0 || x.len() <= rows_per * width || workers::threads() == 1 {
        f(x, y);
    } else {
        let n = rows_per * width;
        workers::for_each_chunk_mut(x, n, |c, a| f(a, &y[c * n..][..a.len()]));
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
    rope_cache_factors(pos, base, rope_dim, None, out)
}

/// [`rope_cache`] with per-pair frequency factors: pair `i` turns by `θ_i / freq_factors[i]` (ggml-cpu
/// ops.cpp `rope_cache_init`: `rope_yarn(theta / ff, ..)`, with `freq_scale = 1`, `ext_factor = 0`,
/// `mscale = 1`). Gemma 4's "proportional" RoPE on its full-attention layers (`rope_freqs.weight`,
/// `[head_dim/2]`: 1 for the rotated pairs, 1e30 for the rest, conversion/gemma.py
/// `Gemma4Model.generate_extra_tensors`). `freq_factors`, when given, has at least `rope_dim / 2` entries.
pub fn rope_cache_factors(
    pos: usize,
    base: f32,
    rope_dim: usize,
    freq_factors: Option<&[f32]>,
    out: &mut [f32],
) {
    let theta_scale = base.powf(-2.0 / rope_dim as f32);
    let mut theta = pos as f32;
    for (i, pair) in out[..rope_dim].chunks_exact_mut(2).enumerate() {
        let t = match freq_factors {
            Some(ff) => theta / ff[i],
            None => theta,
        };
        pair[0] = t.cos();
        pair[1] = t.sin();
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

/// The exact GELU `0.5·x·(1 + erf(x/√2))` that [`crate::faults::Fault::GeluErf`] puts in place of the
/// tanh approximation; erf by Abramowitz & Stegun 7.1.26 (|error| ≤ 1.5e-7), in f64. Only a fault runs it.
fn gelu_erf_fault(x: f32) -> f32 {
    let z = f64::from(x) / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = (1.0 - poly * (-z * z).exp()).copysign(z);
    (0.5 * f64::from(x) * (1.0 + erf)) as f32
}

/// The error function in f64: its Maclaurin series below |x| = 3 (terms ≤ ~170, so ~1e-14 absolute), the
/// continued fraction of erfc (Abramowitz & Stegun 7.1.14, evaluated backwards over 60 terms) above.
pub fn erf_f64(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 3.0 {
        // erf(x) = 2/√π · Σ (−1)^n x^(2n+1) / (n! (2n+1))
        let (mut term, mut sum, x2) = (a, a, a * a);
        for n in 1..200 {
            term *= -x2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc(a) = exp(−a²)/√π · 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + 2/(a + ...)))))
        let mut f = a;
        for k in (1..=60).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * f)
    };
    r.copysign(x)
}

/// The exact GELU `0.5·x·(1 + erf(x/√2))` in place: HF's `"gelu"` (`nn.functional.gelu`, no
/// approximation; Whisper's `activation_function`), through [`erf_f64`] and rounded once to f32.
pub fn gelu_erf(x: &mut [f32]) {
    for_row_chunks(x, 1024.min(x.len()), |x| {
        x.iter_mut().for_each(|v| {
            let z = f64::from(*v);
            *v = (0.5 * z * (1.0 + erf_f64(z / std::f64::consts::SQRT_2))) as f32
        })
    })
}

/// im2col of a 1-D convolution: `x` `[t_in, c_in]` (rows are time steps) → `cols` `[t_out, c_in·k]` with
/// `cols[t][i·k + j] = x[t·stride + j − pad][i]` (0 outside `0..t_in`), `t_out = (t_in + 2·pad − k)/stride
/// + 1`; a product with a weight `[c_out, c_in·k]` (PyTorch's `Conv1d.weight` `[c_out, c_in, k]` read
/// row-major) is then the convolution (`ggml_im2col` + `ggml_mul_mat`, how ggml's `ggml_conv_1d` and
/// whisper.cpp's encoder convolve). Returns `t_out`.
pub fn im2col_1d(
    x: &[f32],
    c_in: usize,
    k: usize,
    stride: usize,
    pad: usize,
    cols: &mut Vec<f32>,
) -> usize {
    let t_in = x.len() / c_in;
    let t_out = (t_in + 2 * pad - k) / stride + 1;
    cols.clear();
    cols.resize(t_out * c_in * k, 0.0);
    for (t, row) in cols.chunks_exact_mut(c_in * k).enumerate() {
        for j in 0..k {
            let Some(src) = (t * stride + j).checked_sub(pad).filter(|&s| s < t_in) else {
                continue;
            };
            for i in 0..c_in {
                row[i * k + j] = x[src * c_in + i];
            }
        }
    }
    t_out
}

/// GELU in place (`ggml_gelu`, the activation of a non-gated FFN: llama.cpp `build_ffn` with
/// `LLM_FFN_GELU` + `LLM_FFN_SEQ`, StarCoder2's `gelu_pytorch_tanh`). Reference mode: [`gelu_tanh`] in
/// f32; ggml mode: [`ggml_cpu::gelu_row`] (ggml's f16 lookup table, `GGML_GELU_FP16`).
pub fn gelu(x: &mut [f32], mode: NumericsMode) {
    if crate::faults::is(crate::faults::Fault::GeluErf) {
        x.iter_mut().for_each(|v| *v = gelu_erf_fault(*v));
        return;
    }
    for_row_chunks(x, 1024.min(x.len()), |x| match mode {
        NumericsMode::Reference => x.iter_mut().for_each(|v| *v = gelu_tanh(*v)),
        NumericsMode::Ggml => ggml_cpu::gelu_row(x),
    })
}

/// GELU-gated linear unit in place on rows of `width`: `gate[i] = gelu_tanh(gate[i]) · up[i]` (GeGLU,
/// Shazeer 2020; Gemma's MLP, HF `GemmaMLP` with `gelu_pytorch_tanh`).
///
/// llama.cpp builds it as `ggml_geglu_split(ctx, gate, up)` (llama-graph.cpp `build_ffn`, `LLM_FFN_GELU` +
/// `LLM_FFN_PAR`), computed per row by `ggml_vec_geglu_f32`. Reference mode: [`gelu_tanh`] in f32. Ggml
/// mode: [`ggml_cpu::geglu_row`] (ggml's f16 lookup table, `GGML_GELU_FP16`).
pub fn geglu(gate: &mut [f32], up: &[f32], width: usize, mode: NumericsMode) {
    if crate::faults::is(crate::faults::Fault::GeluErf) {
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = gelu_erf_fault(*g) * u;
        }
        return;
    }
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
        NumericsMode::Ggml if simd == Simd::Avx512 && target.is_avx512() && simd.available() => {
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

#[cfg(test)]
mod tests;
