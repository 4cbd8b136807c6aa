//! Attention over the KV cache: reference mode's plain f32 form and ggml mode's replica of llama.cpp's
//! `build_attn_mha` graph (`mul_mat(k, q)`, `ggml_soft_max_ext`, `mul_mat(v, kq)` with an F32 cache), per
//! [`GgmlTarget`] and KQV order, with AVX2/AVX-512 builds of the same steps (same bits).

use rayon::prelude::*;

use super::{dot_f32, ggml_cpu, softmax_scaled};
use crate::kv_cache::KvCache;
use crate::numerics::{GgmlTarget, Numerics, NumericsMode, Simd};
use crate::quant::x86::{Emulated, Fma, Hardware, HardwareAvx512};
use crate::workers;

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
    /// Attention logit soft-capping `c` (Gemma 2 `attn_logit_softcapping`): every score becomes
    /// `c · tanh(s · (1/c))` before the scale and the mask — llama.cpp `build_attn_mha`'s
    /// `ggml_scale(kq, 1/c)`, `ggml_tanh`, `ggml_scale(kq, c)` (tanh is libm `tanhf` in ggml-cpu's
    /// `ggml_vec_tanh_f32`, as here). `None`: no capping.
    pub softcap: Option<f32>,
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
            softcap: None,
        }
    }

    /// Apply [`AttnShape::softcap`] to raw KQ scores (masked entries must not be among them: tanh would
    /// turn −∞ into −c).
    #[inline]
    fn cap(&self, scores: &mut [f32]) {
        let Some(c) = self.softcap else { return };
        if crate::faults::is(crate::faults::Fault::SoftcapMissing) {
            return;
        }
        let inv = 1.0 / c;
        for s in scores {
            *s = (*s * inv).tanh() * c;
        }
    }

    /// First key position visible from query position `pos`.
    fn first_visible(&self, pos: usize) -> usize {
        let off_by_one = crate::faults::is(crate::faults::Fault::WindowOffByOne);
        self.window
            .map_or(0, |w| (pos + 1).saturating_sub(w + usize::from(off_by_one)))
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
        NumericsMode::Reference if n == 1 => {
            attention_reference(
                &q[..qw],
                cache,
                layer,
                pos_of(0),
                shape,
                scores,
                &mut out[..qw],
            );
        }
        NumericsMode::Reference => {
            // the queries in parallel, each with its own scores row (a prompt's attention is
            // quadratic in its length: 40% of a single-threaded Gemma 3 pp512); every query is
            // computed by one thread in one fixed order, so the bits do not depend on the split
            let len = scores.len();
            out[..n * qw].par_chunks_mut(qw).enumerate().for_each_init(
                || vec![0f32; len],
                |sc, (t, ot)| {
                    let qt = &q[t * qw..][..qw];
                    attention_reference(qt, cache, layer, pos_of(t), shape, sc, ot);
                },
            );
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
        scores[..first].fill(f32::NEG_INFINITY);
        // eight keys at a time: eight independent chains instead of one key's chain of dependent adds
        let mut i = first;
        while i + 8 <= n_pos {
            let ks: [&[f32]; 8] =
                std::array::from_fn(|j| &keys[(i + j) * head_dim..(i + j + 1) * head_dim]);
            scores[i..i + 8].copy_from_slice(&dot_f32_x8(qh, ks));
            i += 8;
        }
        for (s, k) in scores[i..]
            .iter_mut()
            .zip(keys[i * head_dim..].chunks_exact(head_dim))
        {
            *s = dot_f32(qh, k);
        }
        shape.cap(&mut scores[first..]);
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

/// [`dot_f32`] of `q` with each of eight rows `ks` (each at least `q.len()` long): every row's sum in
/// [`dot_f32`]'s order — rounded products added one by one in element order onto `-0.0` (the neutral
/// element `f32`'s `Sum` folds from) — so the same bits, with the eight chains interleaved.
fn dot_f32_x8(q: &[f32], ks: [&[f32]; 8]) -> [f32; 8] {
    let ks: [&[f32]; 8] = ks.map(|k| &k[..q.len()]);
    let mut acc = [-0.0f32; 8];
    for (d, &qd) in q.iter().enumerate() {
        for (a, k) in acc.iter_mut().zip(&ks) {
            *a += qd * k[d];
        }
    }
    acc
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
    if (pos + 1) * shape.n_head >= PARALLEL_ATTENTION_WORK && workers::threads() > 1 {
        workers::for_each_chunk_mut(out, run * hd, |r, oh| {
            with_head_scratch(run * n_pad, |s| heads(r * run, s, oh))
        });
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
    if n == 1 || work < PARALLEL_ATTENTION_WORK || workers::threads() == 1 {
        for t in 0..n {
            let (qt, ot) = (&q[t * qw..][..qw], &mut out[t * qw..][..qw]);
            attention_ggml(qt, cache, layer, pos_of(t), shape, scores, ot, num, order);
        }
        return;
    }
    let run = head_run(shape);
    let runs = shape.n_head / run;
    workers::for_each_chunk_mut(&mut out[..n * qw], run * hd, |i, oh| {
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
        shape.cap(&mut scores[first..n_pos]);
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
        (GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16, _) => {
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
/// `ggml_cpu::kqv_heads_avx2`, `kqv_heads_avx512`, `kqv_heads64_avx512`): `acc[k] = fma(v[i][d0 + k], p[i], acc[k])` for `i = a, a + n_acc, ...`
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
pub(super) fn kqv_all_d<F: Fma>(
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
            } else if F::AVX512 && hd.is_multiple_of(16) {
                // SAFETY: as above
                unsafe { ggml_cpu::kqv_heads_avx512(h, values, n_pos, hd, p, n_acc, a) };
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

/// Bidirectional multi-head attention over one batch without a KV cache: every query sees every key of
/// the batch (an encoder; `causal` restricts query `t` to keys `0..=t`, which no encoder does — the
/// mutation suite's fault). `q`, `k`, `v`, `out` are `[n, n_head·head_dim]` (`k`, `v`: `n_kv_head` heads);
/// `shape.window` and `shape.softcap` are not read.
///
/// llama.cpp's graph (`build_attn` with `llm_graph_input_attn_no_cache` → `build_attn_mha`, flash
/// attention off): `kq = mul_mat(k, q)` over the permuted Kcur/Qcur, `ggml_soft_max_ext(kq, mask,
/// kq_scale, 0)` with an `n_tokens`-wide F32 mask of zeros (no causal mask: `cparams.causal_attn` is false
/// for BERT), `kqv = mul_mat(cont(transpose(v)), kq)`. The rows are exactly `n` wide: no KV cache pads them.
///
/// Reference mode: [`dot_f32`], [`softmax_scaled`], sequential f32 sums of `p · v`. Ggml mode: every score
/// one [`ggml_cpu::vec_dot_f32`] (`q` is a permuted view: never tinyBLAS); the softmax row
/// [`ggml_cpu::soft_max_row`] over `n` values (vector blocks, then libm `expf` for the `n % lanes` rest);
/// each KQV output `Σ_i p[i]·v[i][d]` by llamafile's tinyBLAS when `llamafile_sgemm` takes the product
/// (`n ≥ 2` query columns and `n` a multiple of the target's lanes: `tinyBLAS::matmul` refuses `k % KN ≠ 0`),
/// else `ggml_vec_dot_f32` over the `n` positions ([`ggml_cpu::vec_dot_f32_by`], with its leftovers).
#[allow(clippy::too_many_arguments)]
pub fn attention_no_cache(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    shape: &AttnShape,
    causal: bool,
    out: &mut [f32],
    num: Numerics,
) {
    attention_cross(q, n, k, v, n, shape, causal, out, num)
}

/// [`attention_no_cache`] with `n_q` query rows over `n` key/value rows that are not the queries' own:
/// cross-attention (Whisper's decoder over the encoder output: HF `WhisperAttention` with
/// `key_value_states`, no mask; whisper.cpp `whisper_build_graph_decoder`'s cross-attention, the
/// `KQ_soft_max` of `ggml_soft_max_ext(KQ, nullptr, KQscale, 0)`). `q`, `out`: `[n_q, n_head·head_dim]`;
/// `k`, `v`: `[n, n_kv_head·head_dim]`. `causal` lets query `t` see keys `0..=t` only (a fault: no
/// cross-attention has a mask). Numerics as [`attention_no_cache`]'s.
#[allow(clippy::too_many_arguments)]
pub fn attention_cross(
    q: &[f32],
    n_q: usize,
    k: &[f32],
    v: &[f32],
    n: usize,
    shape: &AttnShape,
    causal: bool,
    out: &mut [f32],
    num: Numerics,
) {
    let AttnShape {
        n_head,
        n_kv_head,
        head_dim: hd,
        kq_scale,
        ..
    } = *shape;
    let (qw, kvw) = (n_head * hd, n_kv_head * hd);
    assert!(
        q.len() >= n_q * qw && out.len() >= n_q * qw && k.len() >= n * kvw && v.len() >= n * kvw,
        "attention_cross shapes"
    );
    let group = n_head / n_kv_head;
    let target = num.target;
    let tinyblas = n_q >= 2 && n.is_multiple_of(target.lanes());
    let one = |t: usize, h: usize, scores: &mut Vec<f32>, oh: &mut [f32]| {
        let kvh = kv_head(h, group, n_kv_head);
        let n_keys = if causal { (t + 1).min(n) } else { n };
        let qh = &q[t * qw + h * hd..][..hd];
        let key = |i: usize| &k[i * kvw + kvh * hd..][..hd];
        let val = |i: usize, d: usize| v[i * kvw + kvh * hd + d];
        scores.clear();
        match num.mode {
            NumericsMode::Reference => {
                scores.extend((0..n_keys).map(|i| dot_f32(qh, key(i))));
                softmax_scaled(scores, kq_scale);
                oh.fill(0.0);
                for (i, &p) in scores.iter().enumerate() {
                    for (d, o) in oh.iter_mut().enumerate() {
                        *o += p * val(i, d);
                    }
                }
            }
            NumericsMode::Ggml => {
                // the mask row of a causal fault: −∞ past t (llama.cpp's row stays n wide)
                scores.extend((0..n).map(|i| {
                    if i < n_keys {
                        ggml_cpu::vec_dot_f32(target, key(i), qh)
                    } else {
                        f32::NEG_INFINITY
                    }
                }));
                ggml_cpu::soft_max_row(target, scores, None, kq_scale);
                for (d, o) in oh.iter_mut().enumerate() {
                    *o = if tinyblas {
                        ggml_cpu::tinyblas_dot_f32_by::<Emulated>(target, n, |i| val(i, d), scores)
                    } else {
                        ggml_cpu::vec_dot_f32_by::<Emulated>(target, n, |i| val(i, d), scores)
                    };
                }
            }
        }
    };
    // every (query, head) pair computed by one thread in one fixed order: the split changes no bit
    out[..n_q * qw]
        .par_chunks_mut(hd)
        .enumerate()
        .for_each_init(Vec::new, |scores, (i, oh)| {
            one(i / n_head, i % n_head, scores, oh)
        });
}

#[cfg(test)]
mod kq_tests {
    use super::*;

    /// [`dot_f32_x8`] gives [`dot_f32`]'s bits for every row: random rows of several widths, rows whose
    /// products are all `-0.0` (the sum's starting value shows), and NaN / infinite elements.
    #[test]
    fn eight_keys_at_once_give_the_one_key_bits() {
        let mut rng = crate::quant::test_rng::Rng(0x6b65_7973_0008);
        for hd in [1usize, 7, 64, 256] {
            for trial in 0..200 {
                let q: Vec<f32> = (0..hd).map(|_| rng.uniform() * 4.0 - 2.0).collect();
                let rows: Vec<Vec<f32>> = (0..8)
                    .map(|j| {
                        (0..hd)
                            .map(|d| match (trial + j + d) % 23 {
                                0 if trial % 5 == 0 => f32::NAN,
                                1 if trial % 7 == 0 => f32::INFINITY,
                                _ if j == 3 => -0.0 * q[d].signum(),
                                _ => (rng.uniform() - 0.5) * 1e3,
                            })
                            .collect()
                    })
                    .collect();
                let got = dot_f32_x8(&q, std::array::from_fn(|j| &rows[j][..]));
                for (j, row) in rows.iter().enumerate() {
                    let want = dot_f32(&q, row);
                    assert!(
                        got[j].to_bits() == want.to_bits() || (got[j].is_nan() && want.is_nan()),
                        "hd {hd} trial {trial} row {j}: {:e} vs {want:e}",
                        got[j]
                    );
                }
            }
        }
    }
}
