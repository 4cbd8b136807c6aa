//! AVX2 + FMA kernels for F32, F16 and BF16 weights in ggml mode, bit-identical to the scalar replicas in
//! `float.rs`, for both ggml-cpu builds ([`crate::numerics::GgmlTarget`]):
//!
//! - AVX-512 build: `ggml_vec_dot_f32/f16/bf16` (vec.cpp, decode: [`GgmlPath::VecDot`]) and llamafile's
//!   tinyBLAS (ggml-cpu/llamafile/sgemm.cpp, batches of ≥ 2 rows: [`GgmlPath::TinyBlas`]). A 16-lane
//!   AVX-512 accumulator is kept here as two `__m256` halves: every lane sees the same fmas in the same
//!   order, so the bits do not depend on the register width; the final `_mm512_reduce_add_ps` tree is the
//!   scalar `reduce_add_16`. `_mm512_dpbf16_ps` is emulated lane by lane as `float.rs` documents it (odd
//!   pair first, then even; denormal inputs read as zero, denormal results flushed to zero).
//! - AVX-512 build without AVX512-BF16, BF16 weights: `ggml_vec_dot_bf16`'s `__AVX512F__` branch
//!   ([`GgmlPath::VecDotNoBf16`]: two 16-lane fma accumulators over chunks of 32) and `tinyBLAS<16,
//!   __m512, __m512>` ([`GgmlPath::TinyBlasNoBf16`]: the F32/F16 tinyBLAS loop on widened bf16), each
//!   16-lane accumulator again as two halves.
//! - AVX2 build: the same functions' `__AVX2__` branches ([`GgmlPath::VecDotAvx2`]: four 8-lane
//!   accumulators over chunks of 32) and `tinyBLAS<8, __m256>` ([`GgmlPath::TinyBlasAvx2`]: one 8-lane
//!   accumulator per output), on the very registers that build uses.
//!
//! Every function here is `unsafe`: the caller must have checked [`crate::numerics::avx2_available`]; the slices
//! must hold whole rows of matching length (checked with asserts).

use std::arch::x86_64::*;

use super::float::{f32_leftovers, f32x8_reduce_tail};
use super::x86::{hsum_float_8, reduce_add_16_halves};
use super::{GgmlPath, GgmlType};

/// One activation row as the float kernels read it: `x` the activation converted to the weight's type and
/// widened to f32 (`PreparedRow::x`), `raw` its bf16 bytes for BF16 weights (`PreparedRow::blocks`).
#[derive(Clone, Copy)]
pub(crate) struct FloatRow<'a> {
    pub x: &'a [f32],
    pub raw: &'a [u8],
}

/// Eight weights starting at element `i` of `w` (F32, F16 or BF16), widened to f32 (exact: F16 by
/// `_mm256_cvtph_ps`, BF16 by `_mm256_cvtepu16_epi32` and a 16-bit shift, as ggml's AVX2 `LOAD`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8(ty: GgmlType, w: *const u8, i: usize) -> __m256 {
    match ty {
        GgmlType::F32 => _mm256_loadu_ps(w.add(4 * i) as *const f32),
        GgmlType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i) as *const __m128i)),
        _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
            _mm_loadu_si128(w.add(2 * i) as *const __m128i),
        ))),
    }
}

/// The 8 lanes of `a` reduced as `hsum_float_8` / sgemm.cpp's `hsum(__m256)`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum8(a: __m256) -> f32 {
    let mut l = [0f32; 8];
    _mm256_storeu_ps(l.as_mut_ptr(), a);
    hsum_float_8(&l)
}

/// The 16 lanes of `lo` (0..8) and `hi` (8..16) reduced as `_mm512_reduce_add_ps`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn reduce16(lo: __m256, hi: __m256) -> f32 {
    reduce_add_16_halves(lo, hi)
}

/// Denormals to (signed) zero: `vdpbf16ps`'s DAZ on inputs and FTZ on results.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn flush(v: __m256) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let tiny =
        _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_andnot_ps(sign, v), _mm256_set1_ps(f32::MIN_POSITIVE));
    _mm256_blendv_ps(v, _mm256_and_ps(v, sign), tiny)
}

/// One `vdpbf16ps` step on 8 lanes from 16 bf16 weights and 16 bf16 activations (lane `k` holds elements
/// `2k` and `2k + 1`): `acc = ftz(fma(odd_w, odd_x, acc))`, then the same with the even elements.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dpbf16_8(w: *const u8, x: *const u8, acc: __m256) -> __m256 {
    let hi = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    let wv = _mm256_loadu_si256(w as *const __m256i);
    let xv = _mm256_loadu_si256(x as *const __m256i);
    let w_odd = flush(_mm256_castsi256_ps(_mm256_and_si256(wv, hi)));
    let x_odd = flush(_mm256_castsi256_ps(_mm256_and_si256(xv, hi)));
    let w_even = flush(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(wv)));
    let x_even = flush(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(xv)));
    let acc = flush(_mm256_fmadd_ps(w_odd, x_odd, acc));
    flush(_mm256_fmadd_ps(w_even, x_even, acc))
}

/// Float weights (F32, F16 or BF16 `ty`) against `N` activation rows, each through the kernel of its path:
/// [`GgmlPath::TinyBlas`] as `float::dot_tinyblas`, [`GgmlPath::TinyBlasAvx2`] as
/// `float::dot_tinyblas_avx2`, [`GgmlPath::VecDotAvx2`] as `float::dot_{f32,f16,bf16}_avx2`, for BF16
/// [`GgmlPath::TinyBlasNoBf16`] as `float::dot_tinyblas_bf16_avx512f` and [`GgmlPath::VecDotNoBf16`] as
/// `float::dot_bf16_avx512f`, anything else as the AVX-512 build's `ggml_vec_dot_f32/f16/bf16`
/// (`float::dot_f32` / `dot_f16` / `dot_bf16`). The weight row is read once per chunk for all tinyBLAS
/// rows.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `w` holds `x.len()` elements of `ty` for every row (checked),
/// and for BF16 every `raw` holds those elements' bf16 bytes (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_float<const N: usize>(
    ty: GgmlType,
    w: &[u8],
    xs: [FloatRow<'_>; N],
    paths: [GgmlPath; N],
) -> [f32; N] {
    let n = w.len() / ty.type_size();
    assert_eq!(w.len(), n * ty.type_size());
    assert!(matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16));
    for r in &xs {
        assert!(r.x.len() == n && (ty != GgmlType::BF16 || r.raw.len() == 2 * n));
    }
    let wp = w.as_ptr();
    let mut out = [0f32; N];
    // tinyBLAS rows of the AVX-512 builds, all at once (a batch's rows share one path): BF16 with
    // AVX512-BF16 through `dpbf16`, the rest (F32, F16, BF16 without it) one fma per element and lane
    let bf16 = ty == GgmlType::BF16;
    let dp: [bool; N] = std::array::from_fn(|j| bf16 && paths[j] == GgmlPath::TinyBlas);
    let f16l: [bool; N] = std::array::from_fn(|j| match paths[j] {
        GgmlPath::TinyBlas => !bf16,
        GgmlPath::TinyBlasNoBf16 => bf16,
        _ => false,
    });
    let tb: [bool; N] = std::array::from_fn(|j| dp[j] || f16l[j]);
    if tb.iter().any(|&t| t) {
        let mut lo = [_mm256_setzero_ps(); N];
        let mut hi = [_mm256_setzero_ps(); N];
        if dp.iter().any(|&t| t) {
            for base in (0..n - n % 32).step_by(32) {
                for j in (0..N).filter(|&j| dp[j]) {
                    let xr = xs[j].raw.as_ptr();
                    lo[j] = dpbf16_8(wp.add(2 * base), xr.add(2 * base), lo[j]);
                    hi[j] = dpbf16_8(wp.add(2 * base + 32), xr.add(2 * base + 32), hi[j]);
                }
            }
        }
        if f16l.iter().any(|&t| t) {
            for base in (0..n - n % 16).step_by(16) {
                let (w0, w1) = (load8(ty, wp, base), load8(ty, wp, base + 8));
                for j in (0..N).filter(|&j| f16l[j]) {
                    let x = xs[j].x.as_ptr();
                    lo[j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x.add(base)), lo[j]);
                    hi[j] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x.add(base + 8)), hi[j]);
                }
            }
        }
        for j in (0..N).filter(|&j| tb[j]) {
            out[j] = reduce16(lo[j], hi[j]);
        }
    }
    // tinyBLAS rows of the AVX2 build: one __m256 per output, chunks of 8 (all three types)
    let tb8: [bool; N] = std::array::from_fn(|j| paths[j] == GgmlPath::TinyBlasAvx2);
    if tb8.iter().any(|&t| t) {
        let mut c = [_mm256_setzero_ps(); N];
        for base in (0..n - n % 8).step_by(8) {
            let wv = load8(ty, wp, base);
            for j in (0..N).filter(|&j| tb8[j]) {
                c[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xs[j].x.as_ptr().add(base)), c[j]);
            }
        }
        for j in (0..N).filter(|&j| tb8[j]) {
            out[j] = hsum8(c[j]);
        }
    }
    for j in (0..N).filter(|&j| !tb[j] && !tb8[j]) {
        out[j] = match (ty, paths[j]) {
            (_, GgmlPath::VecDotAvx2) => vec_dot_avx2_build(ty, wp, xs[j].x, n),
            (GgmlType::BF16, GgmlPath::VecDotNoBf16) => vec_dot_bf16_avx512f(wp, xs[j].x, n),
            (GgmlType::BF16, _) => vec_dot_bf16(wp, xs[j], n),
            _ => vec_dot_f32_f16(ty, wp, xs[j].x, n),
        };
    }
    out
}

/// `ggml_vec_dot_f32` / `ggml_vec_dot_f16` / `ggml_vec_dot_bf16` of an AVX2 build (see
/// `float::dot_f32_avx2`, `dot_f16_avx2`, `dot_bf16_avx2`): four 8-lane fma accumulators over chunks of
/// 32; F32/F16 reduced by `GGML_F32x8_REDUCE` (`s0 += s2`, `s1 += s3`, `s0 += s1`, two `hadd`s), BF16 by
/// `(c1 + c3) + (c2 + c4)` and `hsum`; leftovers as the scalar replicas (F32: `float::f32_leftovers`;
/// F16 and BF16: rounded products into a double).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_avx2_build(ty: GgmlType, w: *const u8, x: &[f32], n: usize) -> f32 {
    let np = n & !31;
    let xp = x.as_ptr();
    let mut s = [_mm256_setzero_ps(); 4];
    for i in (0..np).step_by(32) {
        for (j, acc) in s.iter_mut().enumerate() {
            let e = i + 8 * j;
            *acc = _mm256_fmadd_ps(load8(ty, w, e), _mm256_loadu_ps(xp.add(e)), *acc);
        }
    }
    let elem = |i: usize| -> f32 {
        match ty {
            GgmlType::F32 => (w.add(4 * i) as *const f32).read_unaligned(),
            GgmlType::F16 => super::fp::f16_to_f32((w.add(2 * i) as *const u16).read_unaligned()),
            _ => super::fp::bf16_to_f32((w.add(2 * i) as *const u16).read_unaligned()),
        }
    };
    if ty == GgmlType::BF16 {
        let c = _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]));
        let mut sumf = 0f64;
        sumf += f64::from(hsum8(c));
        for (i, &xi) in x.iter().enumerate().skip(np) {
            sumf += f64::from(elem(i) * xi);
        }
        return sumf as f32;
    }
    let s0 = _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]));
    let mut l = [0f32; 8];
    _mm256_storeu_ps(l.as_mut_ptr(), s0);
    let reduced = f32x8_reduce_tail(&l);
    if ty == GgmlType::F32 {
        f32_leftovers(reduced, std::slice::from_raw_parts(w, 4 * n), x, np, 4)
    } else {
        let mut sumf = f64::from(reduced);
        for (i, &xi) in x.iter().enumerate().skip(np) {
            sumf += f64::from(elem(i) * xi);
        }
        sumf as f32
    }
}

/// `ggml_vec_dot_f32` / `ggml_vec_dot_f16`, AVX-512 branch (see `float::avx512_body`): four 16-lane
/// accumulators over chunks of 64, `s0 += s2`, `s1 += s3`, `s0 += s1`, `_mm512_reduce_add_ps`; leftovers
/// as the scalar replicas (F32 `float::f32_leftovers` into the f32 sum, F16 rounded products into a
/// double).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_f32_f16(ty: GgmlType, w: *const u8, x: &[f32], n: usize) -> f32 {
    let np = n & !63;
    let xp = x.as_ptr();
    let mut s = [_mm256_setzero_ps(); 8];
    for i in (0..np).step_by(64) {
        for (h, acc) in s.iter_mut().enumerate() {
            let e = i + 8 * h;
            *acc = _mm256_fmadd_ps(load8(ty, w, e), _mm256_loadu_ps(xp.add(e)), *acc);
        }
    }
    // accumulator j of 16 lanes = halves (2j, 2j + 1)
    let lo = _mm256_add_ps(_mm256_add_ps(s[0], s[4]), _mm256_add_ps(s[2], s[6]));
    let hi = _mm256_add_ps(_mm256_add_ps(s[1], s[5]), _mm256_add_ps(s[3], s[7]));
    let reduced = reduce16(lo, hi);
    if ty == GgmlType::F32 {
        let w = std::slice::from_raw_parts(w, 4 * n);
        f32_leftovers(reduced, w, x, np, 8)
    } else {
        let mut sumf = f64::from(reduced);
        for (i, &xi) in x.iter().enumerate().skip(np) {
            let wi = (w.add(2 * i) as *const u16).read_unaligned();
            sumf += f64::from(super::fp::f16_to_f32(wi) * xi);
        }
        sumf as f32
    }
}

/// `ggml_vec_dot_bf16`, `__AVX512BF16__` branch (see `float::dot_bf16`): two 16-lane `dpbf16`
/// accumulators over chunks of 64 (elements 0..32 and 32..64), each reduced and added into a double;
/// leftovers `sumf += (double)(w * x)`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_bf16(w: *const u8, x: FloatRow<'_>, n: usize) -> f32 {
    let xr = x.raw.as_ptr();
    let mut c = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 64 <= n {
        for (h, acc) in c.iter_mut().enumerate() {
            let e = i + 16 * h;
            *acc = dpbf16_8(w.add(2 * e), xr.add(2 * e), *acc);
        }
        i += 64;
    }
    let mut sumf = f64::from(reduce16(c[0], c[1]));
    sumf += f64::from(reduce16(c[2], c[3]));
    for (j, &xj) in x.x.iter().enumerate().skip(i) {
        let wj = (w.add(2 * j) as *const u16).read_unaligned();
        sumf += f64::from(super::fp::bf16_to_f32(wj) * xj);
    }
    sumf as f32
}

/// `ggml_vec_dot_bf16`, `__AVX512F__` branch of a build without AVX512-BF16 (see
/// `float::dot_bf16_avx512f`): two 16-lane fma accumulators over chunks of 32 (elements 0..16 and
/// 16..32), each reduced as `_mm512_reduce_add_ps` and added into a double that starts at +0.0;
/// leftovers `sumf += (double)(w * x)`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_bf16_avx512f(w: *const u8, x: &[f32], n: usize) -> f32 {
    let xp = x.as_ptr();
    let mut c = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (h, acc) in c.iter_mut().enumerate() {
            let e = i + 8 * h;
            *acc = _mm256_fmadd_ps(
                load8(GgmlType::BF16, w, e),
                _mm256_loadu_ps(xp.add(e)),
                *acc,
            );
        }
        i += 32;
    }
    let mut sumf = 0f64;
    sumf += f64::from(reduce16(c[0], c[1]));
    sumf += f64::from(reduce16(c[2], c[3]));
    for (j, &xj) in x.iter().enumerate().skip(i) {
        let wj = (w.add(2 * j) as *const u16).read_unaligned();
        sumf += f64::from(super::fp::bf16_to_f32(wj) * xj);
    }
    sumf as f32
}

/// `ggml_cpu_fp32_to_fp16` (ggml-cpu.c) on F16C: `src` rounded to f16 eight at a time by
/// `_mm256_cvtps_ph(x, 0)` (round to nearest even, NaN kept quiet with its payload, as the scalar
/// `fp::f32_to_f16_cpu`), written to `dst` as little-endian bytes, and widened back into `widened`
/// (exact), the row ggml mode's float kernels read (`PreparedRow`).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C. Panics unless `dst` holds `2·src.len()` bytes and `widened`
/// `src.len()` floats.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn round_row_f16(src: &[f32], dst: &mut [u8], widened: &mut [f32]) {
    let n = src.len();
    assert!(dst.len() == 2 * n && widened.len() == n, "f16 row of {n}");
    let full = n - n % 8;
    for i in (0..full).step_by(8) {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
        _mm_storeu_si128(dst.as_mut_ptr().add(2 * i) as *mut __m128i, h);
        _mm256_storeu_ps(widened.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
    }
    for i in full..n {
        let h = super::fp::f32_to_f16_cpu(src[i]);
        dst[2 * i..2 * i + 2].copy_from_slice(&h.to_le_bytes());
        widened[i] = super::fp::f16_to_f32(h);
    }
}
