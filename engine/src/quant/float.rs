//! F32, F16 and BF16 rows: conversion and ggml-cpu's x86 dot products for float weights.
//!
//! For these weight types the activation is converted to the weight's own type (`vec_dot_type` = the type
//! itself) by `ggml_cpu_fp32_to_fp32` / `ggml_cpu_fp32_to_fp16` (F16C, round to nearest even) /
//! `ggml_cpu_fp32_to_bf16` (`ggml_compute_fp32_to_bf16`) — the same bytes in an AVX2 and an AVX-512
//! build (F16C `cvtps_ph` rounding to nearest even in both, scalar bf16 rounding in both). The dot kernels
//! live in ggml-cpu/vec.cpp, the batched ones in llamafile/sgemm.cpp, and both depend on the build
//! ([`crate::numerics::GgmlTarget`]):
//!
//! - AVX-512 build (`__AVX512F__`): `GGML_F32_STEP` 64, `GGML_F32_EPR` 16, no AVX512-FP16 in the build;
//!   tinyBLAS `<16, __m512>`: [`dot_f32`], [`dot_f16`], [`dot_tinyblas`]. BF16 weights depend on
//!   AVX512-BF16: with it (`__AVX512BF16__`, [`GgmlTarget::Avx512`]) `_mm512_dpbf16_ps` in
//!   `ggml_vec_dot_bf16` and tinyBLAS `<32, __m512bh>`: [`dot_bf16`], [`dot_tinyblas`]; without it
//!   ([`GgmlTarget::Avx512NoBf16`]) the `#elif defined(__AVX512F__)` branches, bf16 widened to f32 and
//!   f32 fmas: [`dot_bf16_avx512f`] (two 16-lane accumulators over chunks of 32) and tinyBLAS `<16,
//!   __m512, __m512>` ([`dot_tinyblas_bf16_avx512f`], the F32/F16 arithmetic);
//! - AVX2 build (`__AVX2__ && __FMA__ && __F16C__`, no `__AVX512F__`): `GGML_F32_STEP` 32,
//!   `GGML_F32_EPR` 8 (`GGML_F32x8` / `GGML_F32Cx8`, reduced by `GGML_F32x8_REDUCE`), the `__AVX2__` branch
//!   of `ggml_vec_dot_bf16` (four `__m256` accumulators, `hsum`-style reduction); tinyBLAS `<8, __m256>`
//!   for all three types (`VECTOR_REGISTERS` 16 changes only the tile shape, not the arithmetic of an
//!   output): [`dot_f32_avx2`], [`dot_f16_avx2`], [`dot_bf16_avx2`], [`dot_tinyblas_avx2`].

use super::fp::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16_ref, read_f32, read_u16};
use super::x86::{fma, hsum_float_8, reduce_add_16};
use crate::numerics::GgmlTarget;

/// Little-endian f32 bytes to f32.
pub(crate) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *o = read_f32(b, 0);
    }
}

/// Little-endian f16 bytes to f32 (exact).
pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16_to_f32(read_u16(b, 0));
    }
}

/// Little-endian bf16 bytes to f32 (exact).
pub(crate) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_to_f32(read_u16(b, 0));
    }
}

/// f32 to little-endian f32 bytes.
pub(crate) fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (b, v) in dst.chunks_exact_mut(4).zip(src) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

/// f32 to f16 bytes as `ggml_fp32_to_fp16_row` (libggml-base, `GGML_FP32_TO_FP16`: canonical NaN).
pub(crate) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (b, &v) in dst.chunks_exact_mut(2).zip(src) {
        b.copy_from_slice(&f32_to_f16_ref(v).to_le_bytes());
    }
}

/// f32 to bf16 bytes as `ggml_fp32_to_bf16_row_ref` / `ggml_cpu_fp32_to_bf16`.
pub(crate) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (b, &v) in dst.chunks_exact_mut(2).zip(src) {
        b.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
    }
}

/// `fma(w, x, acc)` (one rounding), computed as `w * x + acc` when `F16` says both factors are f16 values
/// widened to f32 (F16 weights against the activation ggml rounds to f16): two 11-bit significands make a
/// product of at most 22 bits, and f16's range (2^-24 .. 65504) squared stays inside f32's normal range, so
/// f32's `w * x` is exact and the add is the one rounding — the fma's bits, without its emulation.
#[inline(always)]
fn fma_of<const F16: bool>(w: f32, x: f32, acc: f32) -> f32 {
    if F16 {
        w * x + acc
    } else {
        fma(w, x, acc)
    }
}

/// The AVX-512 body shared by `ggml_vec_dot_f32` and `ggml_vec_dot_f16` (vec.cpp, `GGML_F32_VEC` /
/// `GGML_F16_DOT_VEC`): over chunks of 64, four accumulators of 16 lanes, `sum[j] = fma(w, x, sum[j])`;
/// then `GGML_F32x16_REDUCE`: `sum[0] += sum[2]`, `sum[1] += sum[3]`, `sum[0] += sum[1]`,
/// `_mm512_reduce_add_ps`. Returns the reduced value and the number of elements consumed.
#[inline]
fn avx512_body<const F16: bool>(n: usize, w: impl Fn(usize) -> f32, x: &[f32]) -> (f32, usize) {
    let np = n & !63;
    let mut sum = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, s) in sum.iter_mut().enumerate() {
            let base = i + 16 * j;
            for (l, a) in s.iter_mut().enumerate() {
                *a = fma_of::<F16>(w(base + l), x[base + l], *a);
            }
        }
    }
    let [mut s0, mut s1, s2, s3] = sum;
    for l in 0..16 {
        s0[l] += s2[l];
        s1[l] += s3[l];
    }
    for l in 0..16 {
        s0[l] += s1[l];
    }
    (reduce_add_16(&s0), np)
}

/// The leftover loop of `ggml_vec_dot_f32` (`for (i = np; i < n; ++i) sumf += x[i]*y[i];`) as GCC -O3
/// compiles it (read from the disassembly of both `libggml-cpu.so` builds): vectorized over the first
/// `L − L % vw` of the `L` leftover elements (`vmulps`: rounded products, then added into `sumf` one by
/// one in element order), the last `L % vw` elements contracted to `vfmadd231ss`. `vw` is 8 in the
/// AVX-512 build (16- and 8-wide chunks), 4 in the AVX2 build (8- and 4-wide chunks).
#[inline]
pub(crate) fn f32_leftovers(mut sumf: f32, w: &[u8], x: &[f32], np: usize, vw: usize) -> f32 {
    let fused_from = x.len() - (x.len() - np) % vw;
    for (i, &xi) in x.iter().enumerate().skip(np) {
        let wi = read_f32(w, 4 * i);
        sumf = if i < fused_from {
            sumf + wi * xi
        } else {
            fma(wi, xi, sumf)
        };
    }
    sumf
}

/// `ggml_vec_dot_f32` (vec.cpp, AVX-512 branch): [`avx512_body`], then the leftover elements added into the
/// f32 sum ([`f32_leftovers`] with 8-wide chunks).
pub(crate) fn dot_f32(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let (sumf, np) = avx512_body::<false>(n, |i| read_f32(w, 4 * i), x);
    f32_leftovers(sumf, w, x, np, 8)
}

/// `ggml_vec_dot_f16` (vec.cpp, AVX-512 branch without AVX512-FP16: f16 widened to f32): [`avx512_body`]
/// into a double, leftovers `sumf += (double)(w * x)` with the product rounded to f32, result rounded to
/// f32. `x` is the activation already rounded to f16 and widened.
pub(crate) fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let (reduced, np) = avx512_body::<true>(n, |i| f16_to_f32(read_u16(w, 2 * i)), x);
    let mut sumf = f64::from(reduced);
    for (i, &xi) in x.iter().enumerate().skip(np) {
        sumf += f64::from(f16_to_f32(read_u16(w, 2 * i)) * xi);
    }
    sumf as f32
}

/// Denormals-are-zero on an input of `vdpbf16ps`.
#[inline]
fn daz(v: f32) -> f32 {
    if v.is_subnormal() {
        0f32.copysign(v)
    } else {
        v
    }
}

/// One `vdpbf16ps` step on a lane: "FP32 FMA with DAZ in, FTZ out, round to nearest even" (Intel SDM).
#[inline]
fn bf16_fma(a: f32, b: f32, acc: f32) -> f32 {
    let r = fma(daz(a), daz(b), daz(acc));
    daz(r)
}

/// `ggml_vec_dot_bf16` (vec.cpp, `__AVX512BF16__` branch): over chunks of 64, two accumulators of 16 lanes
/// fed by `_mm512_dpbf16_ps`, which for lane `k` adds the odd pair `2k+1` then the even pair `2k` with
/// DAZ/FTZ fmas; each accumulator is reduced by `_mm512_reduce_add_ps` and added into a double; leftovers
/// `sumf += (double)(w * x)`; result rounded to f32. `x` is the activation rounded to bf16 and widened.
pub(crate) fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let wv = |i: usize| bf16_to_f32(read_u16(w, 2 * i));
    let mut c1 = [0f32; 16];
    let mut c2 = [0f32; 16];
    let mut i = 0;
    while i + 64 <= n {
        for (half, c) in [&mut c1, &mut c2].into_iter().enumerate() {
            let base = i + 32 * half;
            for (k, a) in c.iter_mut().enumerate() {
                let (o, e) = (base + 2 * k + 1, base + 2 * k);
                *a = bf16_fma(wv(o), x[o], *a);
                *a = bf16_fma(wv(e), x[e], *a);
            }
        }
        i += 64;
    }
    let mut sumf = f64::from(reduce_add_16(&c1));
    sumf += f64::from(reduce_add_16(&c2));
    for (j, &xj) in x.iter().enumerate().skip(i) {
        sumf += f64::from(wv(j) * xj);
    }
    sumf as f32
}

/// `ggml_vec_dot_bf16` (vec.cpp, `#elif defined(__AVX512F__)` branch: an AVX-512 build without
/// `__AVX512BF16__`, [`GgmlTarget::Avx512NoBf16`]): over chunks of 32, two 16-lane accumulators
/// `c1 = _mm512_add_ps(_mm512_mul_ps(w, x), c1)` for elements `0 .. 16` and `c2` likewise for `16 .. 32`
/// (bf16 widened by a 16-bit shift, exact), which GCC contracts to `vfmadd231ps` (read in the disassembly
/// of the native `libggml-cpu.so` of an AVX-512 host without AVX512-BF16: one rounding, and plain AVX-512
/// arithmetic, no DAZ/FTZ); then `ggml_float sumf = 0; sumf += _mm512_reduce_add_ps(c1); sumf +=
/// _mm512_reduce_add_ps(c2)` (a −0.0 sum becomes +0.0); leftovers `sumf += (double)(w * x)` with the
/// product rounded to f32 (`vmulss`); result rounded to f32. `x` is the activation rounded to bf16 and
/// widened.
pub(crate) fn dot_bf16_avx512f(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let wv = |i: usize| bf16_to_f32(read_u16(w, 2 * i));
    let mut c = [[0f32; 16]; 2];
    let mut i = 0;
    while i + 32 <= n {
        for (h, ch) in c.iter_mut().enumerate() {
            let base = i + 16 * h;
            for (l, a) in ch.iter_mut().enumerate() {
                *a = fma(wv(base + l), x[base + l], *a);
            }
        }
        i += 32;
    }
    let mut sumf = 0f64;
    sumf += f64::from(reduce_add_16(&c[0]));
    sumf += f64::from(reduce_add_16(&c[1]));
    for (j, &xj) in x.iter().enumerate().skip(i) {
        sumf += f64::from(wv(j) * xj);
    }
    sumf as f32
}

/// The tinyBLAS arithmetic of `tinyBLAS<16, __m512, __m512, T, T, float>` for one output: one 16-lane
/// accumulator, `c[l] = fma(w, x, c[l])` (`madd` = `_mm512_fmadd_ps`) over chunks of 16 elements in
/// order, then `hsum(__m512)` = `_mm512_reduce_add_ps`. `F16` as in [`fma_of`].
#[inline]
fn tinyblas_16<const F16: bool>(w: impl Fn(usize) -> f32, x: &[f32]) -> f32 {
    let n = x.len();
    let mut c = [0f32; 16];
    for base in (0..n - n % 16).step_by(16) {
        for (l, a) in c.iter_mut().enumerate() {
            *a = fma_of::<F16>(w(base + l), x[base + l], *a);
        }
    }
    reduce_add_16(&c)
}

/// One output of llamafile's `tinyBLAS` (ggml-cpu/llamafile/sgemm.cpp, `tinyBLAS::gemm_bloc`), which is
/// what ggml-cpu runs for F32, F16 and BF16 weights in a batch of ≥ 2 activation rows when the row count
/// is a multiple of 4 and the row length of `KN` ([`tinyblas_applies`]), AVX-512 build:
///
/// - F32 and F16 (`tinyBLAS<16, __m512, __m512, ...>`): one accumulator of 16 lanes, `c[l] = fma(w, x,
///   c[l])` over chunks of 16 elements in order (F16 widened by `_mm512_cvtph_ps`, exact), then
///   `hsum` = `_mm512_reduce_add_ps`;
/// - BF16 with AVX512-BF16 (`tinyBLAS<32, __m512, __m512bh, ...>`): chunks of 32 elements through
///   `_mm512_dpbf16_ps` (lane `k` adds the pair `2k + 1`, then `2k`, DAZ/FTZ fmas), then
///   `_mm512_reduce_add_ps` (BF16 without AVX512-BF16: [`dot_tinyblas_bf16_avx512f`]).
///
/// The per-output arithmetic does not depend on the tile shape (`RM × RN`) or on the thread split. `x` is
/// the activation already converted to the weight's type and widened (F32: itself). The result is the f32
/// of the reduction, with no double accumulation (unlike `ggml_vec_dot_f16/bf16`).
pub(crate) fn dot_tinyblas(ty: super::GgmlType, w: &[u8], x: &[f32]) -> f32 {
    use super::GgmlType;
    match ty {
        GgmlType::F32 => tinyblas_16::<false>(|i| read_f32(w, 4 * i), x),
        GgmlType::F16 => tinyblas_16::<true>(|i| f16_to_f32(read_u16(w, 2 * i)), x),
        GgmlType::BF16 => {
            let n = x.len();
            let wv = |i: usize| bf16_to_f32(read_u16(w, 2 * i));
            let mut c = [0f32; 16];
            for base in (0..n - n % 32).step_by(32) {
                for (k, a) in c.iter_mut().enumerate() {
                    let (o, e) = (base + 2 * k + 1, base + 2 * k);
                    *a = bf16_fma(wv(o), x[o], *a);
                    *a = bf16_fma(wv(e), x[e], *a);
                }
            }
            reduce_add_16(&c)
        }
        _ => f32::NAN,
    }
}

/// One output of llamafile's `tinyBLAS<16, __m512, __m512, ggml_bf16_t, ggml_bf16_t, float>`
/// (ggml-cpu/llamafile/sgemm.cpp, `case GGML_TYPE_BF16`, `#elif defined(__AVX512F__)`: BF16 weights in
/// an AVX-512 build without `__AVX512BF16__`, [`GgmlTarget::Avx512NoBf16`]): the F32/F16 arithmetic of
/// [`dot_tinyblas`] on bf16 widened by `load<__m512>(const ggml_bf16_t *)` (a 16-bit shift, exact): one
/// 16-lane accumulator, `madd` = `_mm512_fmadd_ps` (`__FMA__`) over chunks of `KN` = 16 elements, then
/// `_mm512_reduce_add_ps`. A true fma: a product of two bf16 values has at most 16 significant bits, but
/// may fall below f32's normal range, where a separate multiply would round. `x` is the activation
/// rounded to bf16 and widened.
pub(crate) fn dot_tinyblas_bf16_avx512f(w: &[u8], x: &[f32]) -> f32 {
    tinyblas_16::<false>(|i| bf16_to_f32(read_u16(w, 2 * i)), x)
}

/// Whether ggml-cpu's `llamafile_sgemm` built for `target` takes a float-weight matmul of `rows` weight
/// rows of `cols` elements against `n_tokens` activation rows: `n ≥ 2`, `m % 4 == 0` (`tinyBLAS::matmul`:
/// the smallest `RM × BM` tile of both `VECTOR_REGISTERS` settings), and `k % KN == 0` with `KN` = 16 for
/// F32/F16 and 32 for BF16 in the AVX-512 build with AVX512-BF16 (`tinyBLAS<16, __m512>`, `<32,
/// __m512bh>`), 16 for all three in one without it (BF16 `tinyBLAS<16, __m512, __m512>`), 8 for all
/// three in the AVX2 build (`tinyBLAS<8, __m256>`; BF16 needs `__AVX2__`, F16 `__F16C__`); otherwise the
/// vec_dot kernels run. The activation is first converted to the weight's type
/// (`ggml_compute_forward_mul_mat` tries `llamafile_sgemm` with the F32 activation, which fails for
/// F16/BF16 weights, then again on `params->wdata` of `vec_dot_type`).
pub(crate) fn tinyblas_applies(
    ty: super::GgmlType,
    rows: usize,
    cols: usize,
    n_tokens: usize,
    target: GgmlTarget,
) -> bool {
    use super::GgmlType;
    let kn = match (ty, target) {
        (GgmlType::F32 | GgmlType::F16 | GgmlType::BF16, GgmlTarget::Avx2) => 8,
        (GgmlType::F32 | GgmlType::F16 | GgmlType::BF16, GgmlTarget::Avx512NoBf16) => 16,
        (GgmlType::F32 | GgmlType::F16, GgmlTarget::Avx512) => 16,
        (GgmlType::BF16, GgmlTarget::Avx512) => 32,
        _ => return false,
    };
    n_tokens >= 2 && rows.is_multiple_of(4) && cols.is_multiple_of(kn)
}

/// `GGML_F32x8_REDUCE` (ggml-cpu/simd-mappings.h, `__AVX__` branch) of one 8-lane register, after the
/// accumulators were folded into it: `t[i] = a[i] + a[i + 4]` (low half + high half), then two
/// `_mm_hadd_ps`: `(t0 + t1) + (t2 + t3)`. Not the order of [`hsum_float_8`] (`(t0 + t2) + (t1 + t3)`).
#[inline]
pub(crate) fn f32x8_reduce_tail(a: &[f32; 8]) -> f32 {
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// The AVX2 body shared by `ggml_vec_dot_f32` and `ggml_vec_dot_f16` (vec.cpp, `GGML_F32_VEC` =
/// `GGML_F32x8`, `GGML_F16_DOT_VEC` = `GGML_F32Cx8`: `GGML_F32_STEP` 32, `GGML_F32_EPR` 8, so four
/// accumulators of 8 lanes): over chunks of 32, `sum[j] = fma(w, x, sum[j])` (`_mm256_fmadd_ps`, F16
/// widened by `_mm256_cvtph_ps`, exact); then `GGML_F32x8_REDUCE`: `sum[0] += sum[2]`,
/// `sum[1] += sum[3]`, `sum[0] += sum[1]`, [`f32x8_reduce_tail`]. Returns the reduced value and the
/// number of elements consumed.
#[inline]
fn avx2_body<const F16: bool>(n: usize, w: impl Fn(usize) -> f32, x: &[f32]) -> (f32, usize) {
    let np = n & !31;
    let mut sum = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, s) in sum.iter_mut().enumerate() {
            let base = i + 8 * j;
            for (l, a) in s.iter_mut().enumerate() {
                *a = fma_of::<F16>(w(base + l), x[base + l], *a);
            }
        }
    }
    let [mut s0, mut s1, s2, s3] = sum;
    for l in 0..8 {
        s0[l] += s2[l];
        s1[l] += s3[l];
    }
    for l in 0..8 {
        s0[l] += s1[l];
    }
    (f32x8_reduce_tail(&s0), np)
}

/// `ggml_vec_dot_f32` (vec.cpp) of an AVX2 build: [`avx2_body`] into an f32 `sumf`, then the leftover
/// elements (`n % 32`) as GCC compiled `sumf += x[i]*y[i]` there ([`f32_leftovers`] with 4-wide chunks).
pub(crate) fn dot_f32_avx2(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let (sumf, np) = avx2_body::<false>(n, |i| read_f32(w, 4 * i), x);
    f32_leftovers(sumf, w, x, np, 4)
}

/// `ggml_vec_dot_f16` (vec.cpp) of an AVX2 build (`GGML_F16_DOT_*` = `GGML_F32Cx8`): [`avx2_body`] into
/// a double, leftovers `sumf += (double)(w * x)` with the product rounded to f32, result rounded to f32.
/// `x` is the activation already rounded to f16 and widened.
pub(crate) fn dot_f16_avx2(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let (reduced, np) = avx2_body::<true>(n, |i| f16_to_f32(read_u16(w, 2 * i)), x);
    let mut sumf = f64::from(reduced);
    for (i, &xi) in x.iter().enumerate().skip(np) {
        sumf += f64::from(f16_to_f32(read_u16(w, 2 * i)) * xi);
    }
    sumf as f32
}

/// `ggml_vec_dot_bf16` (vec.cpp, `__AVX2__` branch, no `__AVX512F__`): over chunks of 32, four 8-lane
/// accumulators `c_j = _mm256_add_ps(_mm256_mul_ps(w, x), c_j)` for elements `8j .. 8j + 8` (bf16 widened
/// by a 16-bit shift, exact), which GCC contracts to `vfmadd231ps` (checked in the disassembly of the
/// AVX2 `libggml-cpu.so`; one rounding, no DAZ/FTZ: plain AVX arithmetic, unlike `vdpbf16ps`); then `c1 = (c1 + c3) + (c2 + c4)`, reduced as [`hsum_float_8`]
/// (high + low half, `movehl`, `movehdup`), added into a double; leftovers `sumf += (double)(w * x)`;
/// result rounded to f32. `x` is the activation rounded to bf16 and widened.
pub(crate) fn dot_bf16_avx2(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let wv = |i: usize| bf16_to_f32(read_u16(w, 2 * i));
    let mut c = [[0f32; 8]; 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, cj) in c.iter_mut().enumerate() {
            let base = i + 8 * j;
            for (l, a) in cj.iter_mut().enumerate() {
                *a = fma(wv(base + l), x[base + l], *a);
            }
        }
        i += 32;
    }
    let folded: [f32; 8] = std::array::from_fn(|l| (c[0][l] + c[2][l]) + (c[1][l] + c[3][l]));
    // `ggml_float sumf = 0; sumf += (ggml_float)hsum`: a -0.0 sum becomes +0.0
    let mut sumf = 0f64;
    sumf += f64::from(hsum_float_8(&folded));
    for (j, &xj) in x.iter().enumerate().skip(i) {
        sumf += f64::from(wv(j) * xj);
    }
    sumf as f32
}

/// One output of llamafile's `tinyBLAS<8, __m256, __m256, T, T, float>` (ggml-cpu/llamafile/sgemm.cpp,
/// `tinyBLAS::gemm_bloc`, AVX2 build) for F32, F16 and BF16 weights: one 8-lane accumulator,
/// `c[l] = fma(w, x, c[l])` (`madd` = `_mm256_fmadd_ps`) over chunks of `KN` = 8 elements in order (F16
/// widened by `_mm256_cvtph_ps`, BF16 by a 16-bit shift: exact), then `hsum(__m256)` = [`hsum_float_8`].
/// The tile shape (`mnpack<4, 3, BM>` with `VECTOR_REGISTERS` 16) and the thread split do not change an
/// output. `x` is the activation converted to the weight's type and widened; no double accumulation.
pub(crate) fn dot_tinyblas_avx2(ty: super::GgmlType, w: &[u8], x: &[f32]) -> f32 {
    use super::GgmlType;
    let n = x.len();
    let wv = |i: usize| match ty {
        GgmlType::F32 => read_f32(w, 4 * i),
        GgmlType::F16 => f16_to_f32(read_u16(w, 2 * i)),
        _ => bf16_to_f32(read_u16(w, 2 * i)),
    };
    if !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return f32::NAN;
    }
    let mut c = [0f32; 8];
    for base in (0..n - n % 8).step_by(8) {
        for (l, a) in c.iter_mut().enumerate() {
            *a = if ty == GgmlType::F16 {
                fma_of::<true>(wv(base + l), x[base + l], *a)
            } else {
                fma(wv(base + l), x[base + l], *a)
            };
        }
    }
    hsum_float_8(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 values of every kind the kernels meet: ordinary ones of mixed sign and scale, outliers, and
    /// tiny ones whose products fall below f32's normal range (where an fma and a multiply-then-add
    /// differ), drawn by a fixed xorshift.
    fn bf16_row(n: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
        let mut s = seed;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                match s % 16 {
                    0 => u * 1e-20,
                    1 => u * 300.0,
                    _ => u,
                }
            })
            .collect();
        let mut b = vec![0u8; 2 * n];
        quantize_bf16(&v, &mut b);
        let mut f = vec![0f32; n];
        dequantize_bf16(&b, &mut f);
        (b, f)
    }

    /// `_mm512_reduce_add_ps` as GCC expands it (disassembly of `ggml_vec_dot_bf16`): the high 256 bits
    /// plus the low, the high 128 plus the low, then `(a0 + a2) + (a1 + a3)`.
    fn model_reduce(v: &[f32; 16]) -> f32 {
        let a: [f32; 8] = std::array::from_fn(|k| v[8 + k] + v[k]);
        let b: [f32; 4] = std::array::from_fn(|k| a[4 + k] + a[k]);
        (b[0] + b[2]) + (b[1] + b[3])
    }

    /// `ggml_vec_dot_bf16`'s `__AVX512F__` branch (vec.cpp) written out: `c1`, `c2` over chunks of 32
    /// with the contracted `add(mul(w, x), c)` = one fma, two reductions into a double from 0, then the
    /// leftovers as rounded f32 products into the double.
    fn model_vec_dot(w: &[f32], x: &[f32]) -> f32 {
        let n = w.len();
        let (mut c1, mut c2) = ([0f32; 16], [0f32; 16]);
        let mut i = 0;
        while i + 32 <= n {
            for l in 0..16 {
                c1[l] = w[i + l].mul_add(x[i + l], c1[l]);
                c2[l] = w[i + 16 + l].mul_add(x[i + 16 + l], c2[l]);
            }
            i += 32;
        }
        let mut sumf = 0f64;
        sumf += f64::from(model_reduce(&c1));
        sumf += f64::from(model_reduce(&c2));
        while i < n {
            sumf += f64::from(w[i] * x[i]);
            i += 1;
        }
        sumf as f32
    }

    /// `tinyBLAS<16, __m512, __m512, ggml_bf16_t, ...>::gemm_bloc` for one `C` element: `Cv =
    /// madd(load(A + l), load(B + l), Cv)` for `l = 0, 16, ..` (`_mm512_fmadd_ps`), then `hsum(Cv)`.
    fn model_tinyblas(w: &[f32], x: &[f32]) -> f32 {
        let mut cv = [0f32; 16];
        for l in (0..w.len()).step_by(16) {
            for (e, c) in cv.iter_mut().enumerate() {
                *c = w[l + e].mul_add(x[l + e], *c);
            }
        }
        model_reduce(&cv)
    }

    #[test]
    fn bf16_vec_dot_of_an_avx512_build_without_avx512_bf16_is_the_ggml_loop() {
        let mut differs_from_dpbf16 = false;
        for (t, n) in [
            0usize, 1, 5, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 95, 100, 257, 1000, 1027,
        ]
        .into_iter()
        .enumerate()
        {
            let (wb, w) = bf16_row(n, 0x9e37_79b9 + t as u64);
            let (_, x) = bf16_row(n, 0x7f4a_7c15 + t as u64);
            let want = model_vec_dot(&w, &x);
            let got = dot_bf16_avx512f(&wb, &x);
            assert_eq!(got.to_bits(), want.to_bits(), "n {n}: {got:e} vs {want:e}");
            // with AVX512-BF16 (`dpbf16` pairs, DAZ/FTZ) the same row sums differently somewhere
            differs_from_dpbf16 |= dot_bf16(&wb, &x).to_bits() != got.to_bits();
        }
        assert!(differs_from_dpbf16);
    }

    #[test]
    fn bf16_tinyblas_of_an_avx512_build_without_avx512_bf16_is_the_ggml_loop() {
        for (t, k) in [16usize, 48, 80, 112, 272, 1008].into_iter().enumerate() {
            let (wb, w) = bf16_row(k, 0x51_7cc1 + t as u64);
            let (_, x) = bf16_row(k, 0x2545_f491 + t as u64);
            let want = model_tinyblas(&w, &x);
            let got = dot_tinyblas_bf16_avx512f(&wb, &x);
            assert_eq!(got.to_bits(), want.to_bits(), "k {k}: {got:e} vs {want:e}");
        }
        // an fma, not a multiply then an add: in lane 0, −2^127 from the first chunk, then 2^64 · 2^64
        // from the second, which `_mm512_fmadd_ps` adds exactly (2^127) where `w * x` would overflow
        let mut w = vec![0f32; 32];
        let mut x = vec![0f32; 32];
        (w[0], x[0]) = (2f32.powi(127), -1.0);
        (w[16], x[16]) = (2f32.powi(64), 2f32.powi(64));
        let mut wb = vec![0u8; 64];
        quantize_bf16(&w, &mut wb);
        let got = dot_tinyblas_bf16_avx512f(&wb, &x);
        assert_eq!(got, 2f32.powi(127));
        assert_eq!(got.to_bits(), model_tinyblas(&w, &x).to_bits());
        assert_eq!(w[16] * x[16] + w[0] * x[0], f32::INFINITY);
    }
}
