//! Shared numeric blocks of transformer forward passes: RMSNorm, RoPE, softmax, SiLU-gated units and causal
//! grouped-query attention over the KV cache.
//!
//! Each op states the llama.cpp / ggml function whose arithmetic it follows (order of operations, which
//! sums are kept in f64), because parity with llama.cpp depends on those details. Activations are row-major
//! `[n_tokens, width]` f32 slices.

use crate::kv_cache::KvCache;

/// RMSNorm in place on every row of `x` (`[n_rows, width]`), then multiply by `weight` (`[width]`).
///
/// y = x · 1/sqrt(mean(x²) + eps) · w, with the sum of squares accumulated in f64 and the mean and scale in
/// f32, as ggml-cpu `ggml_compute_forward_rms_norm_f32` (ops.cpp) followed by `ggml_mul`; the product is
/// evaluated as `(x·scale)·w` in both the fused and unfused ggml paths. Zhang & Sennrich 2019.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let width = weight.len();
    for row in x.chunks_exact_mut(width) {
        let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / width as f64) as f32;
        let scale = 1.0f32 / (mean + eps).sqrt();
        for (v, &w) in row.iter_mut().zip(weight) {
            *v = *v * scale * w;
        }
    }
}

/// Precomputed cos/sin for rotary position embeddings of one position: `[rope_dim]` interleaved as
/// `cos0, sin0, cos1, sin1, ...` (ggml-cpu `ggml_rope_cache_init` with ext_factor = 0, freq_scale = 1,
/// attn_factor = 1).
///
/// θ_i = pos · base^(−2i/d) computed as ggml does: `theta_scale = powf(base, -2/d)` and θ multiplied by it
/// once per pair (a running f32 product, not a fresh `powf` per pair). Su et al. 2021 (RoFormer).
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
/// this interleaved one. ggml-cpu `rotate_pairs` with `n_offset = 1`.
pub fn rope_norm(x: &mut [f32], head_dim: usize, rope_dim: usize, cache: &[f32]) {
    for head in x.chunks_exact_mut(head_dim) {
        for (pair, cs) in head[..rope_dim].chunks_exact_mut(2).zip(cache.chunks_exact(2)) {
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * cs[0] - x1 * cs[1];
            pair[1] = x0 * cs[1] + x1 * cs[0];
        }
    }
}

/// Softmax in place over `x`, with inputs pre-scaled by `scale`: p_i = exp(s·x_i − max) / Σ.
///
/// The sum is accumulated in f64 and the normalisation multiplies by `1/sum`, as ggml-cpu
/// `ggml_compute_forward_soft_max_f32` / `ggml_vec_soft_max_f32`. A row whose entries are all −∞ (fully
/// masked) becomes all zeros instead of NaN.
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

/// SiLU-gated linear unit in place: `gate[i] = silu(gate[i]) · up[i]` with silu(x) = x / (1 + e^−x).
/// Shazeer 2020 (GLU variants); llama.cpp `ggml_swiglu_split`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Dot product of two f32 slices, accumulated in f32 left to right.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Causal grouped-query attention of one token against the cache.
///
/// `q`: `[n_head · head_dim]` (after RoPE) for the token at absolute position `pos`; keys and values of
/// positions `0..=pos` must already be in `cache` for `layer`. Query head h reads KV head
/// `h / (n_head / n_kv_head)` (GQA, Ainslie et al. 2023). Writes `[n_head · head_dim]` into `out`.
/// `scores` is scratch of at least `pos + 1` floats. Scale 1/sqrt(head_dim) (Vaswani et al. 2017), applied
/// inside the softmax as llama.cpp's `ggml_soft_max_ext(kq, mask, scale)` does.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    pos: usize,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let group = n_head / n_kv_head;
    let n_pos = pos + 1;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let scores = &mut scores[..n_pos];
    for h in 0..n_head {
        let kvh = h / group;
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        let keys = cache.keys(layer, kvh, n_pos);
        for (s, k) in scores.iter_mut().zip(keys.chunks_exact(head_dim)) {
            *s = dot_f32(qh, k);
        }
        softmax_scaled(scores, scale);
        let oh = &mut out[h * head_dim..(h + 1) * head_dim];
        oh.fill(0.0);
        let values = cache.values(layer, kvh, n_pos);
        for (&p, v) in scores.iter().zip(values.chunks_exact(head_dim)) {
            for (o, &vv) in oh.iter_mut().zip(v) {
                *o += p * vv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut c = vec![0.0; 4];
        rope_cache(0, 10000.0, 4, &mut c);
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        rope_norm(&mut x, 4, 4, &c);
        assert_eq!(x, vec![1.0, 2.0, 3.0, 4.0]);
        rope_cache(5, 10000.0, 4, &mut c);
        rope_norm(&mut x, 4, 4, &c);
        let n: f32 = x.iter().map(|v| v * v).sum();
        assert!((n - 30.0).abs() < 1e-4);
        // pair 0 rotated by θ = 5 rad
        assert!((x[0] - (5f32.cos() - 2.0 * 5f32.sin())).abs() < 1e-5);
    }

    #[test]
    fn attention_single_position_returns_value() {
        let mut cache = KvCache::new(1, 1, 2, 4);
        cache.write(0, 0, &[1.0, 0.0], &[5.0, 6.0]).unwrap();
        let mut out = vec![0.0; 4];
        let mut scores = vec![0.0; 4];
        // two query heads share one kv head
        attention(&[1.0, 1.0, -1.0, 2.0], &cache, 0, 0, 2, 1, 2, &mut scores, &mut out);
        assert_eq!(out, vec![5.0, 6.0, 5.0, 6.0]);
    }
}
