//! Scalar replicas of the ggml-cpu kernels llama.cpp runs for the non-matmul ops, per x86 target.
//!
//! The llama.cpp that lockstep is compared with (llama-cpp-python 0.3.36, ggml 0.25.3) is built with
//! `GGML_NATIVE` by gcc 12 for the CPU of the host that makes the goldens: with AVX-512 F/DQ, ggml-cpu takes
//! its `__AVX512F__ && __AVX512DQ__` branches (16-lane `__m512`, `_mm512_reduce_add_ps`), with AVX2+FMA only
//! its `__AVX2__` branches (8-lane `__m256`, `hsum_float_8` and hadd trees), each with its own polynomial
//! `exp` (`ggml_v_expf`) — see Targets below. Each function here repeats, lane by lane in scalar Rust, the exact
//! sequence of IEEE operations of one of those kernels — the same roundings, the same fused
//! multiply-adds ([`fma`], an exactly rounded `a·b + c`), the same reduction trees ([`reduce_add_16`]) —
//! so that it returns the same bits. Where gcc's code differs from the C source (it contracts `a*b ± c`
//! into fmas: `-ffp-contract=fast` is gcc's default for the GNU dialects ggml is compiled with), the
//! replica follows the machine code; those places say so.
//!
//! The AVX-512 replicas are checked bit for bit against the real `libggml-cpu.so` of an AVX-512 host
//! (through ctypes) by `tests/ops_vs_ggml.rs` on the fixtures written by
//! `oracles/fixtures/make_ops_fixtures.py`. The AVX2 replicas have no kernel-level fixture yet (the fixtures
//! predate them); they are checked end to end: every f32-stored stage of the AVX2 goldens (Gemma 3,
//! Qwen2.5) is bit-identical, and so are SmolLM2 goldens regenerated on an AVX2 host.
//!
//! # Targets
//!
//! Which branches ggml-cpu compiled depends on the CPU of the host that built and ran llama.cpp, so ggml
//! mode takes a [`GgmlTarget`]: the goldens record their host's CPU and the harness picks the target from
//! it. What differs between the AVX2 and the AVX-512 targets (read from the pinned source and checked
//! against a native AVX2 build of it; everything else — quantized dot products, RMSNorm, RoPE, GELU,
//! add/mul/scale, get_rows — is the same on both); the two AVX-512 targets ([`GgmlTarget::Avx512`],
//! [`GgmlTarget::Avx512NoBf16`]) differ only in BF16 weight matmuls (`crate::quant`), not in any op here:
//!
//! | kernel | [`GgmlTarget::Avx512`], [`GgmlTarget::Avx512NoBf16`] | [`GgmlTarget::Avx2`] |
//! |---|---|---|
//! | `ggml_v_expf` | [`expf_avx512`]: degree-5 polynomial with `+1`, `_mm512_scalef_ps` | [`expf_avx2`]: polynomial of `e^b − 1`, bit-built `2^n`, `fma(j, k, k)` |
//! | SiLU/SwiGLU, softmax blocks | 16 lanes, libm tail of `n % 16` | 8 lanes, libm tail of `n % 8` |
//! | softmax block sum | `_mm512_reduce_add_ps` | `hsum_float_8` |
//! | `ggml_vec_dot_f32` | 4 × 16 lanes, `GGML_F32x16_REDUCE` | 4 × 8 lanes, `GGML_F32x8_REDUCE` (hadd tree) |
//! | tinyBLAS F32 (`mul_mat(v, kq)` in prefill) | `tinyBLAS<16, __m512>` | `tinyBLAS<8, __m256>` |
//!
//! ARM and other ISAs are not mirrored.

use crate::numerics::GgmlTarget;
use crate::quant::x86::{fma, hsum_float_8, reduce_add_16, Emulated, Fma};

/// Lanes of an `__m512` of f32 (the widest block any target uses; rows are padded to it).
pub(crate) const LANES: usize = 16;

impl GgmlTarget {
    /// Horizontal sum of one vector of [`GgmlTarget::lanes`] values (`hsum_float_8` /
    /// `_mm512_reduce_add_ps`).
    #[inline]
    fn hsum(self, v: &[f32]) -> f32 {
        match self {
            GgmlTarget::Avx2 => hsum_float_8(v.try_into().expect("8 lanes")),
            GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16 => {
                reduce_add_16(v.try_into().expect("16 lanes"))
            }
        }
    }

    /// [`Self::hsum`] for the callers outside this module.
    #[inline]
    pub(crate) fn hsum_vec(self, v: &[f32]) -> f32 {
        self.hsum(v)
    }

    /// `GGML_F32_VEC_REDUCE` (ggml-cpu/simd-mappings.h) over the four accumulators of
    /// `ggml_vec_dot_f32`: `acc(j, l)` is lane `l` of accumulator `j`. The accumulators are added pairwise
    /// (`(x0 + x2) + (x1 + x3)`), then the vector is reduced as the target does it — AVX-512
    /// `_mm512_reduce_add_ps`; AVX2 `GGML_F32x8_REDUCE`: halves added, then `_mm_hadd_ps` twice, i.e.
    /// `(t0 + t1) + (t2 + t3)`, which is *not* [`Self::hsum`]'s (`hsum_float_8`) `(t0 + t2) + (t1 + t3)`.
    #[inline(always)]
    pub(crate) fn vec_reduce(self, acc: impl Fn(usize, usize) -> f32) -> f32 {
        let mut r = [0f32; LANES];
        for (l, r) in r[..self.lanes()].iter_mut().enumerate() {
            *r = (acc(0, l) + acc(2, l)) + (acc(1, l) + acc(3, l));
        }
        match self {
            GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16 => reduce_add_16(&r),
            GgmlTarget::Avx2 => {
                let t: [f32; 4] = std::array::from_fn(|l| r[l] + r[l + 4]);
                (t[0] + t[1]) + (t[2] + t[3])
            }
        }
    }

    /// One lane of this target's `ggml_v_expf`.
    #[inline]
    pub fn expf(self, x: f32) -> f32 {
        self.expf_f::<Emulated>(x)
    }

    /// [`GgmlTarget::expf`] with the fma of `F`.
    #[inline(always)]
    pub(crate) fn expf_f<F: Fma>(self, x: f32) -> f32 {
        match self {
            GgmlTarget::Avx2 => expf_avx2_f::<F>(x),
            GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16 => expf_avx512_f::<F>(x),
        }
    }
}

// Constants of `ggml_v_expf` (vec.h), as hex floats in the C source. All are exact f32 values.
/// `0x1.8p23`: adding it rounds to an integer (round to nearest even).
const SHIFT: f32 = 12_582_912.0;
/// `0x1.715476p+0` ≈ log2(e).
const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);
/// `0x1.62e4p-1`: ln 2, high part.
const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
/// `0x1.7f7d1cp-20`: ln 2, low part.
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
/// Polynomial coefficients `0x1.0e4020p-7`, `0x1.573e2ep-5`, `0x1.555e66p-3`, `0x1.fffdb6p-2`,
/// `0x1.ffffecp-1`.
const P5: f32 = f32::from_bits(0x3c07_2010);
const P4: f32 = f32::from_bits(0x3d2b_9f17);
const P3: f32 = f32::from_bits(0x3e2a_af33);
const P2: f32 = f32::from_bits(0x3eff_fedb);
const P1: f32 = f32::from_bits(0x3f7f_fff6);

/// `_mm512_scalef_ps(j, n)` for an integral `n`: `j · 2^n`, rounded once (subnormal results included,
/// no flush to zero: ggml leaves MXCSR alone). `j · 2^n` is exact in f64 for |n| ≤ 192, so the single
/// f64 → f32 conversion is the one rounding.
#[inline]
fn scalef(j: f32, n: f32) -> f32 {
    if n.is_nan() || j.is_nan() {
        return f32::NAN;
    }
    debug_assert!(n.abs() <= 192.0 && n == n.trunc());
    let pow2 = f64::from_bits(((1023 + n as i64) as u64) << 52);
    (f64::from(j) * pow2) as f32
}

/// One lane of `ggml_v_expf(__m512)` (ggml-cpu/vec.h, AVX-512 branch; "adapted from ARM's optimized
/// routines", max error 1.45 + 0.5 ulp): `n = round(x·log2e)` by the shift trick, `b = x − n·ln2` in two
/// fmas, a degree-5 polynomial `j ≈ e^b` evaluated as three levels of fmas, then `scalef(j, n)`. Lanes
/// with `|n| > 192` become `+inf` (n > 0) or `0` (so `exp(-inf) = 0`, `exp(+inf) = inf`); NaN stays NaN.
#[must_use]
pub fn expf_avx512(x: f32) -> f32 {
    expf_avx512_f::<Emulated>(x)
}

/// [`expf_avx512`] with the fma of `F`.
#[must_use]
#[inline(always)]
pub(crate) fn expf_avx512_f<F: Fma>(x: f32) -> f32 {
    let z = F::fma(x, LOG2E, SHIFT);
    let n = z - SHIFT;
    // _mm512_fnmadd_ps(n, c, x) = -(n·c) + x, one rounding: the same as F::fma(-n, c, x)
    let b = F::fma(-n, LN2_LO, F::fma(-n, LN2_HI, x));
    let u = b * b;
    let j = F::fma(
        F::fma(F::fma(P5, b, P4), u, F::fma(P3, b, P2)),
        u,
        F::fma(P1, b, 1.0),
    );
    // _CMP_GT_OQ: false for NaN
    if n.abs() > 192.0 {
        return if n > 0.0 { f32::INFINITY } else { 0.0 };
    }
    scalef(j, n)
}

/// One lane of `ggml_v_expf(__m256)` (ggml-cpu/vec.h, `__AVX2__ && __FMA__` branch), a different algorithm
/// from [`expf_avx512`]: the same range reduction `n = round(x·log2e)`, `b = x − n·ln2`, then a polynomial
/// `j ≈ e^b − 1` whose last term `c1·b` is a separate rounded product, `k = 2^n` built from the bits of `z`,
/// and `fma(j, k, k)`. For `|n| > 126` the slow path: `s1 = 2^127` (n > 0) or `2^−125`, `s2 = k/s1`
/// (from bits), `fma(s2, j, s2)·s1`; for `|n| > 192`, `s1·s1` (+inf or +0). NaN stays NaN.
#[must_use]
pub fn expf_avx2(x: f32) -> f32 {
    expf_avx2_f::<Emulated>(x)
}

/// [`expf_avx2`] with the fma of `F`.
#[must_use]
#[inline(always)]
pub(crate) fn expf_avx2_f<F: Fma>(x: f32) -> f32 {
    const C1: f32 = f32::from_bits(0x3f7f_fff6); // 0x1.ffffecp-1
    let z = F::fma(x, LOG2E, SHIFT);
    let n = z - SHIFT;
    let b = F::fma(-n, LN2_LO, F::fma(-n, LN2_HI, x));
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let j = F::fma(F::fma(F::fma(P5, b, P4), u, F::fma(P3, b, P2)), u, C1 * b);
    let an = n.abs();
    // _CMP_GT_OQ: false for NaN
    if an.is_nan() || an <= 126.0 {
        return F::fma(j, k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if an > 192.0 {
        return s1 * s1;
    }
    F::fma(s2, j, s2) * s1
}

/// One lane of `ggml_v_silu` (vec.h) on `target`: `x / (1 + ggml_v_expf(0 − x))`.
#[inline]
#[must_use]
pub fn silu_on(target: GgmlTarget, x: f32) -> f32 {
    x / (1.0 + target.expf(0.0 - x))
}

/// `ggml_silu_f32` (vec.h), the scalar tail of the vector loops: `x / (1 + expf(−x))` with libm's `expf`
/// (glibc's, the same one ggml calls: Rust's `f32::exp` is that `expf`).
#[inline]
#[must_use]
pub fn silu_scalar(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `ggml_vec_swiglu_f32(n, y, x, g)` (vec.cpp) on one row, in place on `x`: `x[i] = silu(x[i]) · g[i]`,
/// [`GgmlTarget::lanes`] at a time with [`silu_on`], the last `n % lanes` elements with [`silu_scalar`].
/// This is what `ggml_compute_forward_swiglu_f32` (ops.cpp) calls per row for the `GGML_GLU_OP_SWIGLU` node
/// that llama.cpp's `build_ffn` builds (`ggml_swiglu_split(ctx, gate, up)` for `LLM_FFN_SILU` +
/// `LLM_FFN_PAR`).
pub fn swiglu_row(target: GgmlTarget, x: &mut [f32], g: &[f32]) {
    swiglu_row_f::<Emulated>(target, x, g)
}

/// [`swiglu_row`] with the fma of `F`.
#[inline(always)]
pub(crate) fn swiglu_row_f<F: Fma>(target: GgmlTarget, x: &mut [f32], g: &[f32]) {
    let lanes = target.lanes();
    let n_vec = x.len() / lanes * lanes;
    let (xv, xt) = x.split_at_mut(n_vec);
    let (gv, gt) = g.split_at(n_vec);
    for (a, &b) in xv.iter_mut().zip(gv) {
        *a = *a / (1.0 + target.expf_f::<F>(0.0 - *a)) * b;
    }
    for (a, &b) in xt.iter_mut().zip(gt) {
        *a = silu_scalar(*a) * b;
    }
}

/// [`swiglu_row`] over every row of `width`, compiled with AVX2 and FMA (the same bits).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn swiglu_rows_avx2(target: GgmlTarget, x: &mut [f32], g: &[f32], width: usize) {
    for (x, g) in x.chunks_exact_mut(width).zip(g.chunks_exact(width)) {
        swiglu_row_f::<crate::quant::x86::Hardware>(target, x, g);
    }
}

/// [`swiglu_row`] for the AVX-512 target over every row of `width`, on a CPU with AVX-512 F: ggml's loop
/// itself (`y = ggml_v_silu(x) · g` sixteen lanes at a time, `ggml_v_silu(x) = x / (1 + ggml_v_expf(0 −
/// x))` with [`v_expf_zmm`]; the tail with [`silu_scalar`]); the bits of the lane-by-lane replica.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn swiglu_rows_avx512(x: &mut [f32], g: &[f32], width: usize) {
    use std::arch::x86_64::*;
    assert_eq!(x.len(), g.len());
    let (one, zero) = (_mm512_set1_ps(1.0), _mm512_setzero_ps());
    for (x, g) in x.chunks_exact_mut(width).zip(g.chunks_exact(width)) {
        let n_vec = width / 16 * 16;
        for i in (0..n_vec).step_by(16) {
            let (px, pg) = (x.as_mut_ptr().add(i), g.as_ptr().add(i));
            let v = _mm512_loadu_ps(px);
            let silu = _mm512_div_ps(v, _mm512_add_ps(one, v_expf_zmm(_mm512_sub_ps(zero, v))));
            _mm512_storeu_ps(px, _mm512_mul_ps(silu, _mm512_loadu_ps(pg)));
        }
        for (a, &b) in x[n_vec..].iter_mut().zip(&g[n_vec..]) {
            *a = silu_scalar(*a) * b;
        }
    }
}

/// `ggml_vec_dot_f32(n, s, 0, x, 0, y, 0, 1)` (vec.cpp, generic `GGML_SIMD` branch) on f32 slices, as
/// compiled for `target` (`L` = [`GgmlTarget::lanes`]):
///
/// 1. over the first `np = n & !(4L − 1)` elements, four L-lane accumulators, `sum[j] = fma(x, y, sum[j])`
///    for the j-th L of every 4L (`GGML_F32_VEC_FMA`);
/// 2. `GGML_F32_VEC_REDUCE`: `sum[0] += sum[2]`, `sum[1] += sum[3]`, `sum[0] += sum[1]`, then AVX-512
///    `_mm512_reduce_add_ps`, AVX2 `t_l = s_l + s_{l+4}` and two `hadd`s: `(t0 + t1) + (t2 + t3)`;
/// 3. the leftovers, `sumf += x[i]*y[i]` in the source, which gcc compiled (machine code of each build) into
///    products rounded and added to `sumf` one by one in order — AVX-512: the first `rem & !7` of them, the
///    rest `(rem & 7)` as scalar fmas; AVX2: the first `rem & !3`, the last `rem & 3` as fmas.
#[must_use]
pub fn vec_dot_f32(target: GgmlTarget, x: &[f32], y: &[f32]) -> f32 {
    vec_dot_f32_by::<Emulated>(target, x.len(), |i| x[i], y)
}

/// [`vec_dot_f32`] with the first operand given by index (a strided row, such as the transposed V view).
#[inline(always)]
pub(crate) fn vec_dot_f32_by<F: Fma>(
    target: GgmlTarget,
    n: usize,
    x: impl Fn(usize) -> f32,
    y: &[f32],
) -> f32 {
    // the lane count as a constant, so that the lane loops become vector instructions
    match target {
        GgmlTarget::Avx2 => vec_dot_f32_lanes::<F, 8>(target, n, x, y),
        GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16 => {
            vec_dot_f32_lanes::<F, 16>(target, n, x, y)
        }
    }
}

/// [`vec_dot_f32_by`] with `L` = `target.lanes()`.
#[inline(always)]
fn vec_dot_f32_lanes<F: Fma, const L: usize>(
    target: GgmlTarget,
    n: usize,
    x: impl Fn(usize) -> f32,
    y: &[f32],
) -> f32 {
    debug_assert!(y.len() >= n && L == target.lanes());
    let np = n / (4 * L) * (4 * L);
    let mut sumf = 0.0f32;
    if np > 0 {
        let mut sum = [[0f32; L]; 4];
        for i in (0..np).step_by(4 * L) {
            for (j, s) in sum.iter_mut().enumerate() {
                let base = i + j * L;
                for (l, a) in s.iter_mut().enumerate() {
                    *a = F::fma(x(base + l), y[base + l], *a);
                }
            }
        }
        sumf = target.vec_reduce(|j, l| sum[j][l]);
    }
    vec_dot_f32_tail::<F>(target, np, n, sumf, x, y)
}

/// [`vec_dot_f32`] with AVX2 + FMA intrinsics, for either target: the four L-lane accumulators are
/// `__m256` halves (L = 16 as two), every lane sees the fmas of [`vec_dot_f32`] in its order, and the
/// reductions are [`GgmlTarget::vec_reduce`]'s tree written with vector adds (the same bits; the generic
/// form does not vectorize: its accumulators stay on the stack). Attention's KQ products run here.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `y` holds at least `x.len()` elements (checked).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn vec_dot_f32_avx2(target: GgmlTarget, x: &[f32], y: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = x.len();
    let y = &y[..n];
    let (lanes, halves) = match target {
        GgmlTarget::Avx2 => (8, 1),
        GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16 => (16, 2),
    };
    let np = n / (4 * lanes) * (4 * lanes);
    let mut sumf = 0.0f32;
    if np > 0 {
        // acc[j][h]: lanes 8h .. 8h + 8 of accumulator j
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        let (px, py) = (x.as_ptr(), y.as_ptr());
        for i in (0..np).step_by(4 * lanes) {
            for (j, a) in acc.iter_mut().enumerate() {
                for (h, a) in a[..halves].iter_mut().enumerate() {
                    let o = i + j * lanes + 8 * h;
                    *a =
                        _mm256_fmadd_ps(_mm256_loadu_ps(px.add(o)), _mm256_loadu_ps(py.add(o)), *a);
                }
            }
        }
        // (s0 + s2) + (s1 + s3), lane by lane
        let r: [__m256; 2] = std::array::from_fn(|h| {
            _mm256_add_ps(
                _mm256_add_ps(acc[0][h], acc[2][h]),
                _mm256_add_ps(acc[1][h], acc[3][h]),
            )
        });
        sumf = match target {
            GgmlTarget::Avx2 => {
                // t_l = r_l + r_{l+4}, then two hadds: (t0 + t1) + (t2 + t3)
                let t = _mm_add_ps(_mm256_castps256_ps128(r[0]), _mm256_extractf128_ps(r[0], 1));
                let t = _mm_hadd_ps(t, t);
                _mm_cvtss_f32(_mm_hadd_ps(t, t))
            }
            GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16 => {
                // _mm512_reduce_add_ps: 16 → 8 (high + low) → 4 → (a0 + a2) + (a1 + a3)
                let t8 = _mm256_add_ps(r[1], r[0]);
                let t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
                let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
                _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)))
            }
        };
    }
    vec_dot_f32_tail::<crate::quant::x86::Hardware>(target, np, n, sumf, |i| x[i], y)
}

/// `scores[i] = ggml_vec_dot_f32(k_i, q)` for the `scores.len()` consecutive rows `k_i` of `keys`, each with
/// the bits of [`vec_dot_f32_avx2`] (and so of [`vec_dot_f32`]): eight keys at a time, their four L-lane
/// accumulators as in that function, then the eight reductions side by side — the same adds of the same
/// operands in the same tree ([`GgmlTarget::vec_reduce`]: AVX2 `hsum` of halves and two `hadd`s; AVX-512
/// `_mm512_reduce_add_ps`'s 16 → 8 → 4 → 2 → 1), with the keys in the lanes of one vector instead of the
/// lanes of each key's vector folded one by one. Keys past a multiple of eight, and rows whose length is
/// not a multiple of the 4·L step (these have a scalar tail), go through [`vec_dot_f32_avx2`].
///
/// # Safety
/// The CPU must have AVX2 and FMA; `keys` holds `scores.len()` rows of `q.len()` (checked).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn kq_scores_avx2(
    target: GgmlTarget,
    keys: &[f32],
    q: &[f32],
    scores: &mut [f32],
) {
    kq_scores_body(target, keys, q, scores)
}

/// [`kq_scores_avx2`] compiled with AVX-512 F and VL as well: the same instructions on 256-bit vectors,
/// with sixteen more vector registers to keep the query in (the same bits).
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512 F and VL; `keys` holds `scores.len()` rows of `q.len()` (checked).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
pub(crate) unsafe fn kq_scores_avx512(
    target: GgmlTarget,
    keys: &[f32],
    q: &[f32],
    scores: &mut [f32],
) {
    kq_scores_body(target, keys, q, scores)
}

/// The body of [`kq_scores_avx2`] and [`kq_scores_avx512`], inlined into each.
///
/// # Safety
/// As [`kq_scores_avx2`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn kq_scores_body(target: GgmlTarget, keys: &[f32], q: &[f32], scores: &mut [f32]) {
    // the common head widths as constants: the key loop then unrolls and keeps the query in registers
    match q.len() {
        64 => kq_scores_hd::<64>(target, keys, q, scores),
        128 => kq_scores_hd::<128>(target, keys, q, scores),
        _ => kq_scores_hd::<0>(target, keys, q, scores),
    }
}

/// [`kq_scores_body`] for head width `HD` (`0`: `q.len()`, any width).
///
/// # Safety
/// As [`kq_scores_avx2`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn kq_scores_hd<const HD: usize>(
    target: GgmlTarget,
    keys: &[f32],
    q: &[f32],
    scores: &mut [f32],
) {
    use std::arch::x86_64::*;
    let hd = if HD > 0 { HD } else { q.len() };
    assert_eq!(hd, q.len());
    assert!(keys.len() >= scores.len() * hd);
    let lanes = target.lanes();
    let batched = if hd > 0 && hd.is_multiple_of(4 * lanes) {
        scores.len() / 8 * 8
    } else {
        0
    };
    let pq = q.as_ptr();
    for k0 in (0..batched).step_by(8) {
        // per key: (s0 + s2) + (s1 + s3) of its four accumulators, per half, as vec_dot_f32_avx2, then
        // eight lanes per key: AVX2 that `r`, AVX-512 `hi + lo` (the 16 → 8 step). Plain loops: a
        // closure here would be compiled without this function's target features.
        let mut t8 = [_mm256_setzero_ps(); 8];
        for (key, t8) in t8.iter_mut().enumerate() {
            let pk = keys.as_ptr().add((k0 + key) * hd);
            *t8 = match target {
                GgmlTarget::Avx2 => kq_lanes::<1>(pk, pq, hd),
                GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16 => kq_lanes::<2>(pk, pq, hd),
            };
        }
        let mut t4 = [_mm256_setzero_ps(); 4];
        for (m, t4) in t4.iter_mut().enumerate() {
            let (a, b) = (t8[2 * m], t8[2 * m + 1]);
            *t4 = _mm256_add_ps(
                _mm256_permute2f128_ps(a, b, 0x31),
                _mm256_permute2f128_ps(a, b, 0x20),
            );
        }
        // 4 → 1, leaving per 128-bit half the keys [0, 2, 4, 6] (low) and [1, 3, 5, 7] (high)
        let one = match target {
            GgmlTarget::Avx2 => {
                // hadd(t, t) twice: (t0 + t1) + (t2 + t3)
                let h01 = _mm256_hadd_ps(t4[0], t4[1]);
                let h23 = _mm256_hadd_ps(t4[2], t4[3]);
                _mm256_hadd_ps(h01, h23)
            }
            GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16 => {
                // t + movehl(t): (t0 + t2, t1 + t3); then add_ss(movehdup): sum of those two
                let p01 = _mm256_add_ps(
                    _mm256_shuffle_ps(t4[0], t4[1], 0b01_00_01_00),
                    _mm256_shuffle_ps(t4[0], t4[1], 0b11_10_11_10),
                );
                let p23 = _mm256_add_ps(
                    _mm256_shuffle_ps(t4[2], t4[3], 0b01_00_01_00),
                    _mm256_shuffle_ps(t4[2], t4[3], 0b11_10_11_10),
                );
                _mm256_add_ps(
                    _mm256_shuffle_ps(p01, p23, 0b10_00_10_00),
                    _mm256_shuffle_ps(p01, p23, 0b11_01_11_01),
                )
            }
        };
        let ordered = _mm256_permutevar8x32_ps(one, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_ps(scores.as_mut_ptr().add(k0), ordered);
    }
    for (i, s) in scores.iter_mut().enumerate().skip(batched) {
        *s = vec_dot_f32_avx2(target, &keys[i * hd..(i + 1) * hd], q);
    }
}

/// One key of [`kq_scores_avx2`] up to its eight-lane vector: the four `8·H`-lane accumulators of
/// `ggml_vec_dot_f32` over `hd` (a multiple of `32·H`) as `__m256` halves, `(s0 + s2) + (s1 + s3)`, and for
/// AVX-512 (`H = 2`) `_mm512_reduce_add_ps`'s first step, high half + low half. `H` is a constant so that
/// the accumulators stay in registers.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `k` and `q` point to `hd` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn kq_lanes<const H: usize>(
    k: *const f32,
    q: *const f32,
    hd: usize,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let lanes = 8 * H;
    let mut acc = [[_mm256_setzero_ps(); H]; 4];
    for i in (0..hd).step_by(4 * lanes) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (h, a) in a.iter_mut().enumerate() {
                let o = i + j * lanes + 8 * h;
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(k.add(o)), _mm256_loadu_ps(q.add(o)), *a);
            }
        }
    }
    let mut r = [_mm256_setzero_ps(); H];
    for (h, r) in r.iter_mut().enumerate() {
        *r = _mm256_add_ps(
            _mm256_add_ps(acc[0][h], acc[2][h]),
            _mm256_add_ps(acc[1][h], acc[3][h]),
        );
    }
    if H == 2 {
        _mm256_add_ps(r[H - 1], r[0])
    } else {
        r[0]
    }
}

/// The leftovers of `ggml_vec_dot_f32` after the first `np` elements (step 3 of [`vec_dot_f32`]):
/// products rounded and added to `sumf` one by one, then the last few as fmas.
#[inline(always)]
fn vec_dot_f32_tail<F: Fma>(
    target: GgmlTarget,
    np: usize,
    n: usize,
    mut sumf: f32,
    x: impl Fn(usize) -> f32,
    y: &[f32],
) -> f32 {
    let rem = n - np;
    let unfused = match target {
        GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16 => rem & !7,
        GgmlTarget::Avx2 => rem & !3,
    };
    let mut i = np;
    while i < np + unfused {
        sumf += x(i) * y[i];
        i += 1;
    }
    while i < n {
        sumf = F::fma(x(i), y[i], sumf);
        i += 1;
    }
    sumf
}

/// One output of llamafile's `tinyBLAS<L, V, V, float, float, float>` (ggml-cpu/llamafile/sgemm.cpp,
/// `gemm_bloc`; AVX-512 `<16, __m512>`, AVX2 `<8, __m256>`): a single L-lane accumulator `Cv = madd(A, B,
/// Cv)` (`_mm*_fmadd_ps`) over the `k` elements L at a time, then `hsum` (`_mm512_reduce_add_ps` /
/// `hsum_float_8`). `k` must be a multiple of L (`tinyBLAS::matmul` refuses other sizes); the tile shape
/// does not change any output's arithmetic.
#[inline(always)]
pub(crate) fn tinyblas_dot_f32_by<F: Fma>(
    target: GgmlTarget,
    k: usize,
    a: impl Fn(usize) -> f32,
    b: &[f32],
) -> f32 {
    let lanes = target.lanes();
    debug_assert_eq!(k % lanes, 0);
    let mut acc = [0f32; LANES];
    for i in (0..k).step_by(lanes) {
        for (l, c) in acc[..lanes].iter_mut().enumerate() {
            *c = F::fma(a(i + l), b[i + l], *c);
        }
    }
    target.hsum(&acc[..lanes])
}

/// `ggml_vec_soft_max_f32(n, y, x, max)` (vec.cpp) in place: `x[i] = ggml_v_expf(x[i] − max)`
/// [`GgmlTarget::lanes`] at a time, each vector's horizontal sum (`_mm512_reduce_add_ps` / `hsum_float_8`)
/// added to a double; the last `n % lanes` with libm `expf`, each added to the double. Returns the sum.
pub fn vec_soft_max_f32(target: GgmlTarget, x: &mut [f32], max: f32) -> f64 {
    vec_soft_max_f32_f::<Emulated>(target, x, max)
}

/// [`vec_soft_max_f32`] with the fma of `F`.
#[inline(always)]
pub(crate) fn vec_soft_max_f32_f<F: Fma>(target: GgmlTarget, x: &mut [f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if F::AVX512 && target.is_avx512() {
        // SAFETY: `F::AVX512` holds only on a CPU with AVX-512 F (`Fma::AVX512`)
        return unsafe { vec_soft_max_f32_zmm(x, max) };
    }
    let lanes = target.lanes();
    let n_vec = x.len() / lanes * lanes;
    let mut sum = 0.0f64;
    for block in x[..n_vec].chunks_exact_mut(lanes) {
        let mut v = [0f32; LANES];
        for (o, e) in v.iter_mut().zip(block.iter_mut()) {
            *e = target.expf_f::<F>(*e - max);
            *o = *e;
        }
        sum += f64::from(target.hsum(&v[..lanes]));
    }
    for e in &mut x[n_vec..] {
        *e = (*e - max).exp();
        sum += f64::from(*e);
    }
    sum
}

/// `ggml_v_expf(__m512)` (ggml-cpu/vec.h, AVX-512 branch) with the instructions it compiles to — the
/// sixteen lanes of [`expf_avx512`] at once (`vscalefps` is the `scalef` that function emulates).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn v_expf_zmm(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let r = _mm512_set1_ps(SHIFT);
    let z = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), r);
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(
        n,
        _mm512_set1_ps(LN2_LO),
        _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x),
    );
    let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(_mm512_set1_ps(P5), b, _mm512_set1_ps(P4)),
            u,
            _mm512_fmadd_ps(_mm512_set1_ps(P3), b, _mm512_set1_ps(P2)),
        ),
        u,
        _mm512_fmadd_ps(_mm512_set1_ps(P1), b, _mm512_set1_ps(1.0)),
    );
    let res = _mm512_scalef_ps(j, n);
    if d == 0 {
        return res;
    }
    let zero = _mm512_setzero_ps();
    let le = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero);
    let alt = _mm512_mask_blend_ps(le, _mm512_set1_ps(f32::INFINITY), zero);
    _mm512_mask_blend_ps(d, res, alt)
}

/// gcc's `_mm512_reduce_add_ps` ([`crate::quant::x86::reduce_add_16`]'s order) on a vector.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn reduce_add_zmm(v: std::arch::x86_64::__m512) -> f32 {
    use std::arch::x86_64::*;
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let t8 = _mm256_add_ps(hi, _mm512_castps512_ps256(v));
    let t4 = _mm_add_ps(_mm256_extractf128_ps::<1>(t8), _mm256_castps256_ps128(t8));
    let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)))
}

/// [`vec_soft_max_f32`] for the AVX-512 target on a CPU that has AVX-512 F: ggml's loop itself
/// (`_mm512_loadu_ps`, `ggml_v_expf`, `_mm512_storeu_ps`, `sum += (ggml_float)_mm512_reduce_add_ps`),
/// the tail with libm `expf`; the bits of the lane-by-lane replica.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn vec_soft_max_f32_zmm(x: &mut [f32], max: f32) -> f64 {
    use std::arch::x86_64::*;
    let n_vec = x.len() / 16 * 16;
    let mut sum = 0.0f64;
    let m = _mm512_set1_ps(max);
    for i in (0..n_vec).step_by(16) {
        let p = x.as_mut_ptr().add(i);
        let v = v_expf_zmm(_mm512_sub_ps(_mm512_loadu_ps(p), m));
        _mm512_storeu_ps(p, v);
        sum += f64::from(reduce_add_zmm(v));
    }
    for e in &mut x[n_vec..] {
        *e = (*e - max).exp();
        sum += f64::from(*e);
    }
    sum
}

/// One row of `ggml_compute_forward_soft_max_f32` (ops.cpp) for `ggml_soft_max_ext(kq, mask, scale,
/// max_bias = 0)` without sinks, in place: `w = x · scale` (`ggml_vec_scale_f32`), `w += slope · mask`
/// with `slope = 1` (no ALiBi), `max` (`ggml_vec_max_f32`, sequential `MAX`), [`vec_soft_max_f32`], then `ggml_vec_scale_f32` by `(float)(1.0 / sum)`.
///
/// `mask` has the row's length (0 or −∞ per element; `None` = no mask). A row with no finite entry makes
/// `sum = 0` and ggml divides by zero (`assert(sum > 0)` in debug builds); this replica returns zeros
/// instead, as [`super::softmax_scaled`] does.
pub fn soft_max_row(target: GgmlTarget, x: &mut [f32], mask: Option<&[f32]>, scale: f32) {
    soft_max_row_f::<Emulated>(target, x, mask, scale)
}

/// [`soft_max_row`] with the fma of `F`.
#[inline(always)]
pub(crate) fn soft_max_row_f<F: Fma>(
    target: GgmlTarget,
    x: &mut [f32],
    mask: Option<&[f32]>,
    scale: f32,
) {
    for v in x.iter_mut() {
        *v *= scale;
    }
    if let Some(m) = mask {
        for (v, &m) in x.iter_mut().zip(m) {
            *v += m;
        }
    }
    let max = vec_max_f32(x);
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let sum = vec_soft_max_f32_f::<F>(target, x, max);
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `ggml_vec_max_f32` (vec.h): `max = MAX(max, x[i])` from `-INFINITY`, `MAX(a, b)` = `a > b ? a : b`.
/// Without a NaN in `x` the result does not depend on the order (up to the sign of a zero maximum, which
/// `x − max` and `exp` do not see), so eight running maxima (the same rule, lane-wise: `vmaxps`) are
/// folded at the end; with a NaN, the sequential fold gives ggml's answer.
#[inline(always)]
pub(crate) fn vec_max_f32(x: &[f32]) -> f32 {
    let max = |m: f32, v: f32| if m > v { m } else { v };
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut nan = false;
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for ((m, &v), _) in lanes.iter_mut().zip(c).zip(0..8) {
            *m = max(*m, v);
            nan |= v.is_nan();
        }
    }
    if nan || rest.iter().any(|v| v.is_nan()) {
        return x.iter().fold(f32::NEG_INFINITY, |m, &v| max(m, v));
    }
    lanes
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |m, &v| max(m, v))
}

/// `rotate_pairs<float>(n_dims, 1, cache, src, dst, 1)` (ops.cpp; `GGML_ROPE_TYPE_NORMAL`) for one
/// head, in place. The source says `x0·cos − x1·sin`, `x0·sin + x1·cos`; gcc vectorized it (in this
/// build: three `vpermilps`, `vmulps` of `[x1, x1]·[sin, cos]`, then `vfmaddsub231ps` of
/// `[x0, x0]·[cos, sin] ∓ that`; the scalar remainder is contracted the same way) into
/// `fma(x0, cos, −(x1·sin))` and `fma(x0, sin, x1·cos)`: the `x1` products rounded, the `x0` ones fused.
pub fn rotate_pairs_norm(head: &mut [f32], cache: &[f32]) {
    rotate_pairs_norm_f::<Emulated>(head, cache)
}

/// [`rotate_pairs_norm`] with the fma of `F`.
#[inline(always)]
pub(crate) fn rotate_pairs_norm_f<F: Fma>(head: &mut [f32], cache: &[f32]) {
    for (pair, cs) in head.chunks_exact_mut(2).zip(cache.chunks_exact(2)) {
        let (x0, x1) = (pair[0], pair[1]);
        let (cos, sin) = (cs[0], cs[1]);
        pair[0] = F::fma(x0, cos, -(x1 * sin));
        pair[1] = F::fma(x0, sin, x1 * cos);
    }
}

/// [`rotate_pairs_norm`] (`neox = false`) or [`rotate_pairs_neox`] on the first `rope_dim` entries of
/// every `head_dim`-wide head of `x`, compiled with FMA (one `vfmadd` per fma; the same bits).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn rotate_heads_fma(
    neox: bool,
    x: &mut [f32],
    head_dim: usize,
    rope_dim: usize,
    cache: &[f32],
) {
    use crate::quant::x86::Hardware;
    for head in x.chunks_exact_mut(head_dim) {
        if neox {
            rotate_pairs_neox_f::<Hardware>(&mut head[..rope_dim], cache);
        } else {
            rotate_pairs_norm_f::<Hardware>(&mut head[..rope_dim], cache);
        }
    }
}

/// `rotate_pairs<float>(n_dims, n_dims/2, cache, src, dst)` (ops.cpp; `GGML_ROPE_TYPE_NEOX`) for the
/// rotated part of one head (`head.len() = n_dims`), in place: element `i` pairs with `i + n_dims/2` and
/// uses `cache[2i], cache[2i+1]`. The same source expression as [`rotate_pairs_norm`], contracted the
/// same way by gcc: `fma(x0, cos, −(x1·sin))`, `fma(x0, sin, x1·cos)`.
pub fn rotate_pairs_neox(head: &mut [f32], cache: &[f32]) {
    rotate_pairs_neox_f::<Emulated>(head, cache)
}

/// [`rotate_pairs_neox`] with the fma of `F`.
#[inline(always)]
pub(crate) fn rotate_pairs_neox_f<F: Fma>(head: &mut [f32], cache: &[f32]) {
    let half = head.len() / 2;
    for i in 0..half {
        let (x0, x1) = (head[i], head[i + half]);
        let (cos, sin) = (cache[2 * i], cache[2 * i + 1]);
        head[i] = F::fma(x0, cos, -(x1 * sin));
        head[i + half] = F::fma(x0, sin, x1 * cos);
    }
}

/// `ggml_gelu_f32(x)` (vec.h) as gcc compiles it: `0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f +
/// GELU_COEF_A*x*x)))` with the inner `1 + a·x·x` contracted into `fma(a·x, x, 1)`; glibc `tanhf`.
#[inline]
fn gelu_f32(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const GELU_COEF_A: f32 = 0.044_715;
    let inner = fma(GELU_COEF_A * x, x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

/// `ggml_table_gelu_f16`, filled by `ggml_cpu_init` (ggml-cpu.c): for every f16 bit pattern `i`,
/// `fp16(ggml_gelu_f32(f32(i)))` (F16C `_cvtss_sh`, round to nearest even = `half::f16::from_f32_const`,
/// the portable conversion: the same bits, no F16C under any `--simd` setting).
fn gelu_table() -> &'static [u16] {
    use std::sync::OnceLock;
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|i| {
                half::f16::from_f32_const(gelu_f32(half::f16::from_bits(i).to_f32_const()))
                    .to_bits()
            })
            .collect()
    })
}

/// `ggml_vec_geglu_f32(n, y, x, g)` (vec.h, `GGML_GELU_FP16` branch, defined by default in ggml-cpu) on
/// one row, in place on `x`: `x ≤ −10 → 0`, `x ≥ 10 → x·g`, otherwise the f16 table entry of `fp16(x)`
/// times `g`. So ggml's GELU is an f16-precision function (relative error up to ~5e-4), which reference
/// mode's f32 [`super::gelu_tanh`] does not share.
pub fn geglu_row(x: &mut [f32], g: &[f32]) {
    let table = gelu_table();
    for (a, &b) in x.iter_mut().zip(g) {
        *a = if *a <= -10.0 {
            0.0
        } else if *a >= 10.0 {
            *a * b
        } else {
            let t = half::f16::from_f32_const(*a).to_bits();
            half::f16::from_bits(table[t as usize]).to_f32_const() * b
        };
    }
}

/// Heads per call of [`kqv_heads_avx2`] at most (three heads × four slots of eight dimensions are twelve
/// of the sixteen AVX2 registers).
pub(crate) const KQV_HEADS: usize = 3;

/// The KQV accumulators of `h ≤ KQV_HEADS` heads that share one V (`ops::kqv_all_d`), on AVX2 registers:
/// for head `j`, slot `a < n_acc` and each eight dimensions `d0`, `acc[(j·n_acc + a)·hd + d0 ..][..8] =
/// Σ fma(v[i][d0 ..], p_j[i], ·)` over `i = a, a + n_acc, ...` below `p_len` in increasing order, from 0
/// (rows past `n_pos` are zeros, as in llama.cpp's padded view), `p_j = p[j·stride ..][..p_len]`: the
/// fmas of the scalar `ops::kqv_slot`, in the same order per accumulator. Each row of V is
/// loaded once for all `h` heads.
///
/// # Safety
/// The CPU must have AVX2 and FMA. `1 ≤ h ≤ KQV_HEADS`, `n_acc` a multiple of 4, `p_len` of `n_acc`, `hd`
/// of 8; the slices are checked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn kqv_heads_avx2(
    h: usize,
    values: &[f32],
    n_pos: usize,
    hd: usize,
    p: (&[f32], usize, usize),
    n_acc: usize,
    acc: &mut [f32],
) {
    match h {
        1 => kqv_heads::<1, 8>(values, n_pos, hd, p, n_acc, acc),
        2 => kqv_heads::<2, 4>(values, n_pos, hd, p, n_acc, acc),
        3 => kqv_heads::<3, 4>(values, n_pos, hd, p, n_acc, acc),
        _ => unreachable!("kqv_heads_avx2 takes 1 to {KQV_HEADS} heads"),
    }
}

/// [`kqv_heads_avx2`] for 64-wide heads on a CPU with AVX-512 F and VL: each accumulator slot in one
/// pass over its positions with all `H · 8` eight-dimension accumulators in registers (24 of the 32 for
/// three heads), so that a position's probabilities are broadcast once for its eight V loads and 8·H
/// fmas. Every accumulator takes the same fmas in the same order as in [`kqv_heads_avx2`] (same bits).
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512 F and VL. `1 ≤ h ≤ KQV_HEADS`, `p_len` a multiple of `n_acc`;
/// the slices are checked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
pub(crate) unsafe fn kqv_heads64_avx512(
    h: usize,
    values: &[f32],
    n_pos: usize,
    p: (&[f32], usize, usize),
    n_acc: usize,
    acc: &mut [f32],
) {
    match h {
        1 => kqv_heads64::<1>(values, n_pos, p, n_acc, acc),
        2 => kqv_heads64::<2>(values, n_pos, p, n_acc, acc),
        3 => kqv_heads64::<3>(values, n_pos, p, n_acc, acc),
        _ => unreachable!("kqv_heads64_avx512 takes 1 to {KQV_HEADS} heads"),
    }
}

/// [`kqv_heads64_avx512`] for `H` heads.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn kqv_heads64<const H: usize>(
    values: &[f32],
    n_pos: usize,
    (p, stride, p_len): (&[f32], usize, usize),
    n_acc: usize,
    acc: &mut [f32],
) {
    use std::arch::x86_64::*;
    const HD: usize = 64;
    const C: usize = HD / 8;
    assert!(n_acc > 0 && p_len.is_multiple_of(n_acc));
    assert!(values.len() >= n_pos * HD && p.len() >= (H - 1) * stride + p_len);
    assert!(acc.len() >= H * n_acc * HD);
    for a in 0..n_acc {
        let mut r = [[_mm256_setzero_ps(); C]; H];
        let mut i = a;
        // positions a, a + n_acc, ... in increasing order; rows past n_pos are zeros (fma kept)
        while i < p_len {
            let real = i < n_pos;
            let mut pj = [_mm256_setzero_ps(); H];
            for (j, pj) in pj.iter_mut().enumerate() {
                *pj = _mm256_set1_ps(*p.get_unchecked(j * stride + i));
            }
            #[allow(clippy::needless_range_loop)]
            // c indexes the dimensions and each head's accumulators
            for c in 0..C {
                let v = if real {
                    _mm256_loadu_ps(values.as_ptr().add(i * HD + 8 * c))
                } else {
                    _mm256_setzero_ps()
                };
                for j in 0..H {
                    r[j][c] = _mm256_fmadd_ps(v, pj[j], r[j][c]);
                }
            }
            i += n_acc;
        }
        for (j, r) in r.iter().enumerate() {
            for (c, r) in r.iter().enumerate() {
                _mm256_storeu_ps(acc.as_mut_ptr().add((j * n_acc + a) * HD + 8 * c), *r);
            }
        }
    }
}

/// [`kqv_heads_avx2`] on 512-bit registers, for head dimensions that are a multiple of 16 (128, 256):
/// each zmm accumulator holds two of the eight-dimension accumulators of one slot side by side, so a
/// lane takes the same fmas in the same order as in [`kqv_heads_avx2`] (same bits) with half the
/// instructions and V loads. The 64-wide heads have their own all-in-registers kernel
/// ([`kqv_heads64_avx512`]).
///
/// # Safety
/// The CPU must have AVX2, FMA and AVX-512 F. `1 ≤ h ≤ KQV_HEADS`, `n_acc` a multiple of 4, `p_len` of
/// `n_acc`, `hd` of 16; the slices are checked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f")]
pub(crate) unsafe fn kqv_heads_avx512(
    h: usize,
    values: &[f32],
    n_pos: usize,
    hd: usize,
    p: (&[f32], usize, usize),
    n_acc: usize,
    acc: &mut [f32],
) {
    let wide = n_acc.is_multiple_of(8);
    match (h, wide) {
        (1, true) => kqv_heads_zmm::<1, 8>(values, n_pos, hd, p, n_acc, acc),
        (1, false) => kqv_heads_zmm::<1, 4>(values, n_pos, hd, p, n_acc, acc),
        (2, true) => kqv_heads_zmm::<2, 8>(values, n_pos, hd, p, n_acc, acc),
        (2, false) => kqv_heads_zmm::<2, 4>(values, n_pos, hd, p, n_acc, acc),
        (3, _) => kqv_heads_zmm::<3, 4>(values, n_pos, hd, p, n_acc, acc),
        _ => unreachable!("kqv_heads_avx512 takes 1 to {KQV_HEADS} heads"),
    }
}

/// The body of [`kqv_heads_avx2`] and [`kqv_heads_avx512`] for `H` heads, `S` slots per pass, on vectors
/// of `$w` lanes: `acc` slot `a`'s accumulator of dimensions `d0 .. d0 + $w` takes
/// `fma(v[i][d0 ..], p_j[i], ·)` for `i = a, a + n_acc, ...` in increasing order, from 0. A lane's fmas do
/// not depend on the vector width, so both widths give the same bits.
macro_rules! kqv_heads_kernel {
    ($(#[$doc:meta])* $name:ident, $feat:literal, $w:literal,
     $zero:path, $load:path, $set1:path, $fmadd:path, $store:path) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name<const H: usize, const S: usize>(
            values: &[f32],
            n_pos: usize,
            hd: usize,
            (p, stride, p_len): (&[f32], usize, usize),
            n_acc: usize,
            acc: &mut [f32],
        ) {
            assert!(n_acc.is_multiple_of(S) && p_len.is_multiple_of(n_acc) && hd.is_multiple_of($w));
            assert!(values.len() >= n_pos * hd && p.len() >= (H - 1) * stride + p_len);
            assert!(acc.len() >= H * n_acc * hd);
            let real = n_pos.min(p_len);
            for a0 in (0..n_acc).step_by(S) {
                for d0 in (0..hd).step_by($w) {
                    let mut r = [[$zero(); S]; H];
                    let mut base = 0;
                    // every row of the step is a real one
                    while base + n_acc <= real {
                        for s in 0..S {
                            let i = base + a0 + s;
                            let v = $load(values.as_ptr().add(i * hd + d0));
                            for (j, r) in r.iter_mut().enumerate() {
                                let pj = $set1(*p.get_unchecked(j * stride + i));
                                r[s] = $fmadd(v, pj, r[s]);
                            }
                        }
                        base += n_acc;
                    }
                    // the steps past `n_pos`: real rows, then zeros
                    while base < p_len {
                        for s in 0..S {
                            let i = base + a0 + s;
                            let v = if i < n_pos {
                                $load(values.as_ptr().add(i * hd + d0))
                            } else {
                                $zero()
                            };
                            for (j, r) in r.iter_mut().enumerate() {
                                let pj = $set1(p[j * stride + i]);
                                r[s] = $fmadd(v, pj, r[s]);
                            }
                        }
                        base += n_acc;
                    }
                    for (j, r) in r.iter().enumerate() {
                        for (s, r) in r.iter().enumerate() {
                            let at = (j * n_acc + a0 + s) * hd + d0;
                            $store(acc.as_mut_ptr().add(at), *r);
                        }
                    }
                }
            }
        }
    };
}

kqv_heads_kernel!(
    /// [`kqv_heads_avx512`] for `H` heads, `S` slots per pass (`H · S ≤ 16` zmm accumulators).
    kqv_heads_zmm, "avx2,fma,avx512f", 16,
    std::arch::x86_64::_mm512_setzero_ps, std::arch::x86_64::_mm512_loadu_ps,
    std::arch::x86_64::_mm512_set1_ps, std::arch::x86_64::_mm512_fmadd_ps,
    std::arch::x86_64::_mm512_storeu_ps
);

kqv_heads_kernel!(
    /// [`kqv_heads_avx2`] for `H` heads, `S` slots per pass.
    kqv_heads, "avx2,fma", 8,
    std::arch::x86_64::_mm256_setzero_ps, std::arch::x86_64::_mm256_loadu_ps,
    std::arch::x86_64::_mm256_set1_ps, std::arch::x86_64::_mm256_fmadd_ps,
    std::arch::x86_64::_mm256_storeu_ps
);

#[cfg(test)]
mod tests;

/// `ggml_vec_gelu_f32(n, y, x)` (vec.h, `GGML_GELU_FP16` branch, the default of ggml-cpu) on one row, in
/// place: `x ≤ −10 → 0`, `x ≥ 10 → x`, otherwise the f16 table entry of `fp16(x)` ([`geglu_row`] without
/// the gate product).
pub fn gelu_row(x: &mut [f32]) {
    let table = gelu_table();
    for a in x.iter_mut() {
        *a = if *a <= -10.0 {
            0.0
        } else if *a >= 10.0 {
            *a
        } else {
            let t = half::f16::from_f32_const(*a).to_bits();
            half::f16::from_bits(table[t as usize]).to_f32_const()
        };
    }
}

/// `ggml_compute_forward_norm_f32` (ops.cpp) on one row, in place, for `target`'s build: the mean from
/// `ggml_vec_sum_f32` (an f64 sum, one element at a time, rounded to f32, then divided in f32), the
/// variance from `ggml_vec_cvar_f32` (vec.cpp: `d = x − mean` stored, `d·d` in blocks of the target's
/// lanes — `_mm512_reduce_add_ps` for AVX-512 F+DQ, the `hsum_float_8` tree for AVX2 — each block's f32
/// sum added to an f64 accumulator, the tail one square at a time; the f64 sum over `n` rounded to f32),
/// `scale = 1/sqrtf(var + eps)`, `y = d·scale` (`ggml_vec_scale_f32`).
pub fn norm_row(target: GgmlTarget, row: &mut [f32], eps: f32) {
    let n = row.len();
    let sum: f64 = row.iter().map(|&v| v as f64).sum();
    let mean = (sum as f32) / n as f32;
    let lanes = target.lanes();
    let mut acc = 0f64;
    let mut i = 0;
    let mut sq = [0f32; LANES];
    while i + lanes <= n {
        for (s, v) in sq[..lanes].iter_mut().zip(&mut row[i..i + lanes]) {
            *v -= mean;
            *s = *v * *v;
        }
        acc += target.hsum(&sq[..lanes]) as f64;
        i += lanes;
    }
    for v in &mut row[i..] {
        *v -= mean;
        acc += (*v * *v) as f64;
    }
    let var = (acc / n as f64) as f32;
    let scale = 1.0f32 / (var + eps).sqrt();
    for v in row.iter_mut() {
        *v *= scale;
    }
}
