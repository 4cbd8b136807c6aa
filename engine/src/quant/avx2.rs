//! AVX2 + FMA kernels: ggml-cpu's x86 dot products written with the same intrinsics, so that ggml mode
//! with SIMD on gives the same bits as the scalar replicas in the per-format modules (and as llama.cpp).
//!
//! Each kernel is the AVX2 branch of its namesake in ggml-cpu's `arch/x86/quants.c`, instruction for
//! instruction where the order of rounding shows: the eight f32 lanes of one `__m256` accumulator, one
//! `_mm256_fmadd_ps` per 32-element block, `hsum_float_8` at the end. Integer steps (`maddubs`, `madd`)
//! are exact for every input a quant block can hold, so ggml's VNNI variants (`dpbusd`) give the same
//! lanes. The `_xN` variants compute `N` activation rows against one weight row at once (the weight's
//! nibbles are unpacked once); each of the `N` results is computed with exactly the single-row steps.
//!
//! Every function here is `unsafe`: the caller must have checked [`available`] (the
//! [`crate::numerics::Simd`] selection does), and the slices must hold whole blocks of matching length (the
//! same contract as the scalar kernels, `debug_assert`ed there).

use std::arch::x86_64::*;

use super::fp::read_f16;
use super::q8::{Q8_0_BYTES, QK};
use super::q8_k::QK_K;
use super::{q4_0, q4_1, q4_k, q5_0, q5_1, q6_k, GgmlPath};

/// `hsum_float_8` (arch/x86/quants.c): high + low 128 bits, `movehl`, `movehdup` + `add_ss`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn hsum_float_8(x: __m256) -> f32 {
    let mut res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}

/// x86 `quantize_row_q8_0` (arch/x86/quants.c, AVX2 branch) on AVX2 registers: per block of 32, max |x|
/// (`_mm256_max_ps` of the four vectors, then 8 → 4 → 2 → 1), `d = max / 127`, `id = max ≠ 0 ? 127 / max
/// : 0`, quants `cvtps_epi32(round(x · id))` packed with saturation (`packs_epi32`, `packs_epi16`,
/// `permutevar8x32`), `d` stored as f16 (`_mm_cvtps_ph`). Writes what the scalar
/// `q8::quantize_act_q8_0` writes — the block bytes, the quants, the widened `d` — plus the quants
/// offset to unsigned (`qu`, `q + 128`); returns whether a quant is −128 (NaN input). Same bytes as the
/// scalar quantizer (test `avx2_quantizer_writes_the_scalar_bytes`).
///
/// # Safety
/// [`available`] must be true. `x` holds whole blocks; the outputs are sized for them (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_row_q8_0(
    x: &[f32],
    blocks: &mut [u8],
    qs: &mut [i8],
    qu: &mut [u8],
    d: &mut [f32],
) -> bool {
    let nb = x.len() / QK;
    assert!(x.len() == nb * QK && blocks.len() >= nb * Q8_0_BYTES && d.len() >= nb);
    assert!(qs.len() >= nb * QK && qu.len() >= nb * QK);
    let sign = _mm256_set1_ps(-0.0);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let (min, flip) = (_mm256_set1_epi8(-128), _mm256_set1_epi8(-128));
    let mut has_min = _mm256_setzero_si256();
    for (ib, d) in d[..nb].iter_mut().enumerate() {
        let p = x.as_ptr().add(ib * QK);
        let v = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(p.add(o)));
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for v in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *v));
        }
        let mut m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let max = _mm_cvtss_f32(m4);
        let dh = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(max / 127.0));
        let id = _mm256_set1_ps(if max != 0.0 { 127.0 / max } else { 0.0 });
        let i = v.map(|v| {
            let r = _mm256_round_ps::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(v, id));
            _mm256_cvtps_epi32(r)
        });
        let q = _mm256_packs_epi16(
            _mm256_packs_epi32(i[0], i[1]),
            _mm256_packs_epi32(i[2], i[3]),
        );
        let q = _mm256_permutevar8x32_epi32(q, perm);
        has_min = _mm256_or_si256(has_min, _mm256_cmpeq_epi8(q, min));
        let blk = blocks.as_mut_ptr().add(ib * Q8_0_BYTES);
        let h = _mm_extract_epi16::<0>(dh) as u16;
        blk.cast::<[u8; 2]>().write_unaligned(h.to_le_bytes());
        _mm256_storeu_si256(blk.add(2) as *mut __m256i, q);
        _mm256_storeu_si256(qs.as_mut_ptr().add(ib * QK) as *mut __m256i, q);
        let u = _mm256_xor_si256(q, flip);
        _mm256_storeu_si256(qu.as_mut_ptr().add(ib * QK) as *mut __m256i, u);
        *d = _mm_cvtss_f32(_mm_cvtph_ps(dh));
    }
    _mm256_movemask_epi8(has_min) != 0
}

/// `mul_sum_us8_pairs_float` (AVX2 branch): unsigned × signed bytes, pairs to i16 (`maddubs`), pairs of
/// those to i32 (`madd` with ones), to f32: lane `l` = the dot of bytes `4l .. 4l+4`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)))
}

/// `mul_sum_i8_pairs_float` (AVX2 branch): `|x|` and `sign(y, x)` with `_mm256_sign_epi8`, then
/// [`mul_sum_us8_pairs_float`].
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    mul_sum_us8_pairs_float(ax, sy)
}

/// `bytes_from_nibbles_32`: 16 bytes of packed nibbles → 32 bytes, low nibbles first.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn bytes_from_nibbles_32(qs: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(qs as *const __m128i);
    let bytes = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    _mm256_and_si256(_mm256_set1_epi8(0x0F), bytes)
}

/// Two consecutive little-endian f16 at `p` widened to f32 with one F16C `vcvtph2ps` (ggml's
/// `GGML_CPU_FP16_TO_FP32` on x86 is `_cvtsh_ss`, the same exact conversion; NaNs come out quiet, as from
/// [`read_f16`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn f16x2(p: *const u8) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1)))
}

/// One f16 at `p` (see [`f16x2`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn f16x1(p: *const u8) -> f32 {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
        (p as *const u16).read_unaligned(),
    )));
    _mm_cvtss_f32(v)
}

/// One activation row in Q8_0/Q8_1 form as the kernels read it: quants, per-block `d`, and (Q8_1) the
/// per-block `s`.
#[derive(Clone, Copy)]
pub(crate) struct Q8Row<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
}

/// `ggml_vec_dot_q4_1_q8_1`, AVX2 branch, for one Q4_1 weight row against `N` activation rows (the `N`
/// independent accumulator chains run interleaved, which one row's fma latency would otherwise
/// serialise; the weight's nibbles are unpacked once). Per block and pair: `summs += m_w * s_x`
/// (contracted to an fma, as gcc does), `acc = fma(d_w * d_x, mul_sum_us8_pairs_float(nibbles, q8),
/// acc)`; result `hsum_float_8(acc) + summs`.
/// Every output has the bits of [`q4_1::dot_q8_1`] for its pair.
///
/// # Safety
/// [`available`] must be true; `w` holds `nb` Q4_1 blocks and every activation row `nb` Q8_1
/// blocks (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_1_q8_1<const N: usize>(w: &[u8], x: [Q8Row<'_>; N]) -> [f32; N] {
    let nb = w.len() / q4_1::BYTES;
    assert_eq!(w.len(), nb * q4_1::BYTES);
    for r in &x {
        assert!(r.qs.len() >= nb * QK && r.d.len() >= nb && r.s.len() >= nb);
    }
    let m_at = q4_1::min_offset();
    let mut acc = [_mm256_setzero_ps(); N];
    let mut summs = [0f32; N];
    for ib in 0..nb {
        let blk = w.as_ptr().add(ib * q4_1::BYTES);
        let (dw, m2) = f16x2(blk);
        let mw = if m_at == 2 {
            m2
        } else {
            read_f16(std::slice::from_raw_parts(blk, 4), m_at)
        };
        let qx = bytes_from_nibbles_32(blk.add(4));
        q8_1_block(qx, dw, mw, &x, ib, &mut acc, &mut summs);
    }
    q8_1_results(&acc, &summs)
}

/// One block of the Q4_1 and Q5_1 kernels: the weight's unsigned quants `qx` (scale `dw`, min `mw`)
/// against block `ib` of every activation row: `summs = fma(m_w, s_x, summs)` (gcc contracts
/// `summs += m*s`), `acc = fma(d_w * d_x, mul_sum_us8_pairs_float(qx, q_x), acc)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q8_1_block<const N: usize>(
    qx: __m256i,
    dw: f32,
    mw: f32,
    x: &[Q8Row<'_>; N],
    ib: usize,
    acc: &mut [__m256; N],
    summs: &mut [f32; N],
) {
    for j in 0..N {
        let r = &x[j];
        summs[j] = mw.mul_add(*r.s.get_unchecked(ib), summs[j]);
        let d = _mm256_set1_ps(dw * *r.d.get_unchecked(ib));
        let qy = _mm256_loadu_si256(r.qs.as_ptr().add(ib * QK) as *const __m256i);
        let xy = mul_sum_us8_pairs_float(qx, qy);
        acc[j] = _mm256_fmadd_ps(d, xy, acc[j]);
    }
}

/// The Q4_1/Q5_1 kernels' results: `hsum_float_8(acc) + summs` per activation row.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q8_1_results<const N: usize>(acc: &[__m256; N], summs: &[f32; N]) -> [f32; N] {
    let mut out = [0f32; N];
    for j in 0..N {
        out[j] = hsum_float_8(acc[j]) + summs[j];
    }
    out
}

/// `ggml_vec_dot_q5_1_q8_1`, AVX2 branch (arch/x86/quants.c; the only kernel llama.cpp runs for Q5_1), for
/// one Q5_1 weight row against `N` activation rows: the Q4_1 kernel with the fifth bits OR-ed in
/// (`bytes_from_bits_32(qh) & 0x10`): per block `summs = fma(m_w, s_x, summs)`, `acc = fma(d_w * d_x,
/// mul_sum_us8_pairs_float(q_w, q_x), acc)`, result `hsum_float_8(acc) + summs`. Every output has the bits
/// of [`super::q5_1::dot_q8_1`].
///
/// # Safety
/// [`available`] must be true; `w` holds `nb` Q5_1 blocks and every activation row `nb` Q8_1
/// blocks (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_1_q8_1<const N: usize>(w: &[u8], x: [Q8Row<'_>; N]) -> [f32; N] {
    let nb = w.len() / q5_1::BYTES;
    assert_eq!(w.len(), nb * q5_1::BYTES);
    for r in &x {
        assert!(r.qs.len() >= nb * QK && r.d.len() >= nb && r.s.len() >= nb);
    }
    let mut acc = [_mm256_setzero_ps(); N];
    let mut summs = [0f32; N];
    for ib in 0..nb {
        let blk = w.as_ptr().add(ib * q5_1::BYTES);
        let (dw, mw) = f16x2(blk);
        let bxhi = _mm256_and_si256(bytes_from_bits_32(blk.add(4)), _mm256_set1_epi8(0x10));
        let qx = _mm256_or_si256(bytes_from_nibbles_32(blk.add(8)), bxhi);
        q8_1_block(qx, dw, mw, &x, ib, &mut acc, &mut summs);
    }
    q8_1_results(&acc, &summs)
}

/// `ggml_vec_dot_q8_0_q8_0`, AVX2 branch (and `tinyBLAS_Q0_AVX`, which computes each output the same
/// way), for one Q8_0 weight row against `N` activation rows: per block and pair `acc = fma(d_w * d_x,
/// mul_sum_i8_pairs_float(q_w, q_x), acc)`, result `hsum_float_8(acc)`. Every output has the bits of
/// [`super::q8::dot_q8_0_q8_0`] (its exact `_mm256_sign_epi8` form included).
///
/// # Safety
/// [`available`] must be true; `w` holds `nb` Q8_0 blocks and every activation row `nb` Q8_0
/// blocks (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q8_0_q8_0<const N: usize>(w: &[u8], x: [Q8Row<'_>; N]) -> [f32; N] {
    let nb = w.len() / Q8_0_BYTES;
    assert_eq!(w.len(), nb * Q8_0_BYTES);
    for r in &x {
        assert!(r.qs.len() >= nb * QK && r.d.len() >= nb);
    }
    let mut acc = [_mm256_setzero_ps(); N];
    for ib in 0..nb {
        let blk = w.as_ptr().add(ib * Q8_0_BYTES);
        let dw = f16x1(blk);
        let qx = _mm256_loadu_si256(blk.add(2) as *const __m256i);
        for j in 0..N {
            let r = &x[j];
            let d = _mm256_set1_ps(dw * *r.d.get_unchecked(ib));
            let qy = _mm256_loadu_si256(r.qs.as_ptr().add(ib * QK) as *const __m256i);
            let q = mul_sum_i8_pairs_float(qx, qy);
            acc[j] = _mm256_fmadd_ps(d, q, acc[j]);
        }
    }
    let mut out = [0f32; N];
    for j in 0..N {
        out[j] = hsum_float_8(acc[j]);
    }
    out
}

/// Repacked 4-bit blocks with Q4_0's layout (`q4_0_8x8_q8_0`, `iq4_nl_8x8_q8_0`,
/// ggml-cpu/arch/x86/repack.cpp) for one weight row against `N` activation rows, as
/// `q4_0::dot_q8_0_repacked_lut` with the nibble table `values`: per block the exact integer dot, then
/// `acc = fma(isum, d_w·d_x, acc)` on one scalar accumulator per row. The gemv (`paths[j]` =
/// [`GgmlPath::RepackGemv`]) passes the weights as the `sign` operand, the gemm the activations, as
/// llama.cpp's `mul_sum_i8_pairs_acc_int32x8` calls do; `maddubs` cannot saturate (|value| ≤ 127,
/// |quant| ≤ 128: pairs ≤ 32512).
///
/// # Safety
/// [`available`] must be true; `w` holds `nb` blocks and every activation row `nb` Q8_0 blocks (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_0_repacked<const N: usize>(
    w: &[u8],
    x: [Q8Row<'_>; N],
    paths: [GgmlPath; N],
    values: &[i8; 16],
) -> [f32; N] {
    let nb = w.len() / q4_0::BYTES;
    assert_eq!(w.len(), nb * q4_0::BYTES);
    for r in &x {
        assert!(r.qs.len() >= nb * QK && r.d.len() >= nb);
    }
    let ones = _mm256_set1_epi16(1);
    let lut128 = _mm_loadu_si128(values.as_ptr() as *const __m128i);
    let lut = _mm256_set_m128i(lut128, lut128);
    let mut acc = [0f32; N];
    for ib in 0..nb {
        let blk = w.as_ptr().add(ib * q4_0::BYTES);
        let dw = f16x1(blk);
        let qw = _mm256_shuffle_epi8(lut, bytes_from_nibbles_32(blk.add(2)));
        for j in 0..N {
            let r = &x[j];
            let qy = _mm256_loadu_si256(r.qs.as_ptr().add(ib * QK) as *const __m256i);
            let (a, b) = if paths[j] == GgmlPath::RepackGemv {
                (qw, qy)
            } else {
                (qy, qw)
            };
            let dot = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
            let isum = hsum_i32_8(_mm256_madd_epi16(dot, ones));
            acc[j] = (isum as f32).mul_add(dw * *r.d.get_unchecked(ib), acc[j]);
        }
    }
    acc
}

/// [`dot_q4_0_repacked`] for eight weight rows against one activation row (a decode step's matrix-vector
/// product, `path` its ggml path): the eight rows' block sums become one vector ([`hsum_i32_8x8`]) and
/// the eight rows' accumulators its lanes, each lane the scalar kernel's `fma(isum, d_w·d_x, acc)` in
/// block order — as llama.cpp's `ggml_gemv_q4_0_8x8_q8_0` keeps eight interleaved rows in the lanes of
/// one vector. Same bits as [`dot_q4_0_repacked`] row by row, without its serial chain of one scalar
/// fma per block. `w` holds the eight rows one after another (eight consecutive rows of a matrix: the
/// kernel prefetches the eight that follow them in memory).
///
/// # Safety
/// As [`dot_q4_0_repacked`]; `w` holds eight rows of `nb` blocks (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_0_repacked_rows8(
    w: &[u8],
    x: Q8Row<'_>,
    path: GgmlPath,
    values: &[i8; 16],
) -> [f32; 8] {
    let row_bytes = w.len() / 8;
    let nb = row_bytes / q4_0::BYTES;
    assert_eq!(w.len(), 8 * nb * q4_0::BYTES);
    assert!(x.qs.len() >= nb * QK && x.d.len() >= nb);
    let w: [*const u8; 8] = std::array::from_fn(|r| w.as_ptr().add(r * row_bytes));
    let ones = _mm256_set1_epi16(1);
    let lut128 = _mm_loadu_si128(values.as_ptr() as *const __m128i);
    let lut = _mm256_set_m128i(lut128, lut128);
    let gemv = path == GgmlPath::RepackGemv;
    let mut acc = _mm256_setzero_ps();
    let mut m = [_mm256_setzero_si256(); 8];
    for ib in 0..nb {
        let qy = _mm256_loadu_si256(x.qs.as_ptr().add(ib * QK) as *const __m256i);
        let dw = rows8_scales(&w, ib);
        for r in 0..8 {
            let blk = w[r].add(ib * q4_0::BYTES);
            // the same block of the next group of eight rows (which follows these in memory) requested
            // now: eight rows read a block from each in turn are an order the hardware prefetchers follow
            // poorly (without it this kernel ran a SmolLM2 Q4_0 decode 20-30% slower than the row-by-row
            // one; with it, 18% faster). A prefetch past the matrix reads nothing and cannot fault.
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(8 * row_bytes) as *const i8);
            let qw = _mm256_shuffle_epi8(lut, bytes_from_nibbles_32(blk.add(2)));
            let (a, b) = if gemv { (qw, qy) } else { (qy, qw) };
            let dot = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
            m[r] = _mm256_madd_epi16(dot, ones);
        }
        acc = rows8_block_fma(&m, dw, *x.d.get_unchecked(ib), acc);
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// Block `ib`'s f16 scales of eight Q4_0 / IQ4_NL rows `w` in one register, row `r` in 16-bit lane `r`
/// (built in registers: eight 2-byte stores read back as one 16-byte load would miss store forwarding).
///
/// # Safety
/// The CPU has AVX2; every row holds more than `ib` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn rows8_scales(w: &[*const u8; 8], ib: usize) -> __m128i {
    let dw: [i16; 8] =
        std::array::from_fn(|r| (w[r].add(ib * q4_0::BYTES) as *const i16).read_unaligned());
    _mm_set_epi16(dw[7], dw[6], dw[5], dw[4], dw[3], dw[2], dw[1], dw[0])
}

/// One block of the eight-row gemv kernels: `acc[r] = fma(Σ m[r], d_w[r]·d_x, acc[r])`, the eight rows'
/// i32 lane sums `m` reduced by [`hsum_i32_8x8`], `dw` their f16 scales ([`rows8_scales`]), `dx` the
/// activation block's scale — each lane the scalar kernel's step.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn rows8_block_fma(
    m: &[__m256i; 8],
    dw: __m128i,
    dx: f32,
    acc: __m256,
) -> __m256 {
    let isum = _mm256_cvtepi32_ps(hsum_i32_8x8(m));
    let d = _mm256_mul_ps(_mm256_cvtph_ps(dw), _mm256_set1_ps(dx));
    _mm256_fmadd_ps(isum, d, acc)
}

/// Lane `j` = the sum of the eight i32 lanes of `v[j]` (exact integers, so the order of the adds does not
/// matter; wrapping as `_mm256_add_epi32`): eight horizontal sums for the price of about one each.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn hsum_i32_8x8(v: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    // per 128-bit half: [s0, s1, s2, s3] and [s4, s5, s6, s7] of that half's lanes
    let h0123 = _mm256_hadd_epi32(h01, h23);
    let h4567 = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256(h0123, h4567, 0x20),
        _mm256_permute2x128_si256(h0123, h4567, 0x31),
    )
}

/// [`dot_q4_0_repacked`] for eight activation rows at once, with their scales transposed (`dt[ib·8 + j]` =
/// row `j`'s `d` of block `ib`, as [`super::tile_scales`] lays them out): the eight rows' block sums
/// become one vector ([`hsum_i32_8x8`]) and the eight accumulators its lanes, each lane the scalar
/// kernel's `fma(isum, d_w·d_x, acc)`. Same bits as [`dot_q4_0_repacked`].
///
/// # Safety
/// As [`dot_q4_0_repacked`]; `dt` holds `8·nb` scales (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_0_repacked_x8(
    w: &[u8],
    x: [Q8Row<'_>; 8],
    dt: &[f32],
    paths: [GgmlPath; 8],
    values: &[i8; 16],
) -> [f32; 8] {
    let nb = w.len() / q4_0::BYTES;
    assert_eq!(w.len(), nb * q4_0::BYTES);
    assert!(dt.len() >= 8 * nb);
    for r in &x {
        assert!(r.qs.len() >= nb * QK && r.d.len() >= nb);
    }
    let ones = _mm256_set1_epi16(1);
    let lut128 = _mm_loadu_si128(values.as_ptr() as *const __m128i);
    let lut = _mm256_set_m128i(lut128, lut128);
    let mut acc = _mm256_setzero_ps();
    let mut m = [_mm256_setzero_si256(); 8];
    for ib in 0..nb {
        let blk = w.as_ptr().add(ib * q4_0::BYTES);
        let qw = _mm256_shuffle_epi8(lut, bytes_from_nibbles_32(blk.add(2)));
        for j in 0..8 {
            let qy = _mm256_loadu_si256(x[j].qs.as_ptr().add(ib * QK) as *const __m256i);
            let (a, b) = if paths[j] == GgmlPath::RepackGemv {
                (qw, qy)
            } else {
                (qy, qw)
            };
            let dot = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
            m[j] = _mm256_madd_epi16(dot, ones);
        }
        let isum = _mm256_cvtepi32_ps(hsum_i32_8x8(&m));
        let d = _mm256_mul_ps(
            _mm256_set1_ps(f16x1(blk)),
            _mm256_loadu_ps(dt.as_ptr().add(8 * ib)),
        );
        acc = _mm256_fmadd_ps(isum, d, acc);
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// `bytes_from_bits_32` (arch/x86/quants.c): the 32 bits at `x` → 32 bytes, `0xFF` where the bit is set
/// and `0` elsewhere (byte `j` from bit `j`).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn bytes_from_bits_32(x: *const u8) -> __m256i {
    let x32 = (x as *const i32).read_unaligned();
    let shuf_mask = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuf_mask);
    let bit_mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1))
}

/// `ggml_vec_dot_q5_0_q8_0`, AVX2 branch (and `tinyBLAS_Q0_AVX`, the same per-output arithmetic), for one
/// Q5_0 weight row against `N` activation rows: per block, the nibbles (`bytes_from_nibbles_32`) OR'd
/// with `0xF0` where the block's high bit is clear (`bytes_from_bits_32`, `andnot`) give the signed 5-bit
/// values; `acc = fma(d_w * d_x, mul_sum_i8_pairs_float(q_w, q_x), acc)`; result `hsum_float_8(acc)`.
/// Every output has the bits of `q5_0::dot_q8_0::<true>` (the `_mm256_sign_epi8` form), which is
/// `dot_q8_0::<false>` wherever no activation quant is -128.
///
/// # Safety
/// [`available`] must be true; `w` holds `nb` Q5_0 blocks and every activation row `nb` Q8_0
/// blocks (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_0_q8_0<const N: usize>(w: &[u8], x: [Q8Row<'_>; N]) -> [f32; N] {
    let nb = w.len() / q5_0::BYTES;
    assert_eq!(w.len(), nb * q5_0::BYTES);
    for r in &x {
        assert!(r.qs.len() >= nb * QK && r.d.len() >= nb);
    }
    let mut acc = [_mm256_setzero_ps(); N];
    for ib in 0..nb {
        let blk = w.as_ptr().add(ib * q5_0::BYTES);
        let dw = f16x1(blk);
        let bxhi = _mm256_andnot_si256(bytes_from_bits_32(blk.add(2)), _mm256_set1_epi8(-16));
        let qx = _mm256_or_si256(bytes_from_nibbles_32(blk.add(6)), bxhi);
        for j in 0..N {
            let r = &x[j];
            let d = _mm256_set1_ps(dw * *r.d.get_unchecked(ib));
            let qy = _mm256_loadu_si256(r.qs.as_ptr().add(ib * QK) as *const __m256i);
            let q = mul_sum_i8_pairs_float(qx, qy);
            acc[j] = _mm256_fmadd_ps(d, q, acc[j]);
        }
    }
    let mut out = [0f32; N];
    for j in 0..N {
        out[j] = hsum_float_8(acc[j]);
    }
    out
}

/// Sum of the eight i32 lanes of `v` (exact, so any order; wrapping as `_mm256_add_epi32`).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum_i32_8(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// One activation row in Q8_K form: 256 quants and one f32 `d` per super-block, `bsums` per 16 quants.
#[derive(Clone, Copy)]
pub(crate) struct Q8kRow<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub bsums: &'a [i16],
}

/// Q4_K weights against Q8_K activations through the kernel llama.cpp runs for each activation row
/// (`paths[j]`): the repacked `ggml_gemv_q4_K_8x8_q8_K` / `ggml_gemm_q4_K_8x8_q8_K` (arch/x86/repack.cpp)
/// or the tiled K-quant matmul (ggml-cpu/tiled). Those kernels round only in their per-super-block fmas;
/// what comes before is exact integers (`isum[g] = sc[g]·Σ q4·q8`, `imin[g] = m[g]·Σ q8`), which this
/// kernel computes with `maddubs`/`madd` and then feeds to the same fmas in the same order as
/// `q4_k::dot_q8_k_repacked` / `q4_k::dot_q8_k_tiled`, whose bits every output has.
/// [`GgmlPath::VecDot`] is not handled here (the caller uses the scalar kernel).
///
/// # Safety
/// [`available`] must be true; `w` holds `nb` Q4_K blocks and every activation row `nb` Q8_K
/// blocks (checked); no path is `VecDot` or `TinyBlas` (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_k_q8_k<const N: usize>(
    w: &[u8],
    x: [Q8kRow<'_>; N],
    paths: [GgmlPath; N],
) -> [f32; N] {
    let nb = w.len() / q4_k::BYTES;
    assert_eq!(w.len(), nb * q4_k::BYTES);
    for r in &x {
        assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * QK_K / 16);
    }
    assert!(paths.iter().all(|p| matches!(
        p,
        GgmlPath::RepackGemv | GgmlPath::RepackGemm | GgmlPath::Tiled
    )));
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [0f32; N];
    let mut accm = [0f32; N];
    for ib in 0..nb {
        let blk = &w[ib * q4_k::BYTES..(ib + 1) * q4_k::BYTES];
        let (dw, dminw) = f16x2(blk.as_ptr());
        let (sc, m) = q4_k::scales_mins(&blk[4..16]);
        // the nibbles of the four 32-byte runs: run c holds sub-blocks 2c (low) and 2c+1 (high)
        let mut nib = [[_mm256_setzero_si256(); 2]; 4];
        for (c, n) in nib.iter_mut().enumerate() {
            let q = _mm256_loadu_si256(blk.as_ptr().add(16 + 32 * c) as *const __m256i);
            n[0] = _mm256_and_si256(q, m4);
            n[1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        }
        for j in 0..N {
            let r = &x[j];
            let qy = r.qs.as_ptr().add(ib * QK_K);
            let bsums = &r.bsums[ib * QK_K / 16..(ib + 1) * QK_K / 16];
            let dy = *r.d.get_unchecked(ib);
            let mut isum = [0i32; 4];
            let mut imin = [0i32; 4];
            for c in 0..4 {
                let yl = _mm256_loadu_si256(qy.add(64 * c) as *const __m256i);
                let yh = _mm256_loadu_si256(qy.add(64 * c + 32) as *const __m256i);
                let pl = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(nib[c][0], yl),
                    _mm256_set1_epi16(i16::from(sc[2 * c])),
                );
                let ph = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(nib[c][1], yh),
                    _mm256_set1_epi16(i16::from(sc[2 * c + 1])),
                );
                isum[c] = hsum_i32_8(_mm256_add_epi32(pl, ph));
                for g in [2 * c, 2 * c + 1] {
                    imin[c] +=
                        i32::from(m[g]) * (i32::from(bsums[2 * g]) + i32::from(bsums[2 * g + 1]));
                }
            }
            let (a, am) = (&mut acc[j], &mut accm[j]);
            match paths[j] {
                GgmlPath::RepackGemv => {
                    let (dsc, dmn) = (dw * dy, dminw * dy);
                    *a = (isum.iter().sum::<i32>() as f32).mul_add(dsc, *a);
                    *am = (imin.iter().sum::<i32>() as f32).mul_add(dmn, *am);
                }
                GgmlPath::RepackGemm => {
                    let (dsc, dmn) = (dw * dy, dminw * dy);
                    for p in 0..4 {
                        *a = (isum[p] as f32).mul_add(dsc, *a);
                        *am = (imin[p] as f32).mul_add(dmn, *am);
                    }
                }
                GgmlPath::Tiled => {
                    let s1 = isum.iter().sum::<i32>() as f32;
                    let s2 = imin.iter().sum::<i32>() as f32;
                    let res = (-dminw).mul_add(s2, dw * s1);
                    *a = res.mul_add(dy, *a);
                }
                GgmlPath::VecDot
                | GgmlPath::TinyBlas
                | GgmlPath::TinyBlasQ0
                | GgmlPath::TinyBlasAvx2
                | GgmlPath::VecDotAvx2
                | GgmlPath::TinyBlasNoBf16
                | GgmlPath::VecDotNoBf16 => {
                    unreachable!("checked above")
                }
            }
        }
    }
    let mut out = [0f32; N];
    for j in 0..N {
        out[j] = match paths[j] {
            GgmlPath::Tiled => acc[j],
            _ => acc[j] - accm[j],
        };
    }
    out
}

/// Q6_K weights against Q8_K activations: `ggml_vec_dot_q6_K_q8_K` (AVX2 branch, arch/x86/quants.c) for
/// `paths[j] = VecDot`, the tiled K-quant matmul (ggml-cpu/tiled) for `Tiled`. Per super-block the eight
/// i32 lanes `Σ_g sc[2g + l/4]·Σ_{k<4} q6·q8` (unsigned 6-bit quants, `maddubs` then `madd` with the
/// scales, exact) are shared: vec_dot subtracts `32·(bsums[2l]·sc[2l] + bsums[2l+1]·sc[2l+1])` per lane
/// and fmas the lanes with `d_w·d_x` into eight accumulators (`hsum_float_8` at the end); tiled sums
/// them to `s1` (minus the same offsets) and does `acc = fma(d_w·s1, d_x, acc)`. Every output has the
/// bits of `q6_k::dot_q8_k` / `q6_k::dot_q8_k_tiled`.
///
/// # Safety
/// [`available`] must be true; `w` holds `nb` Q6_K blocks and every activation row `nb` Q8_K
/// blocks (checked); every path is `VecDot` or `Tiled` (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6_k_q8_k<const N: usize>(
    w: &[u8],
    x: [Q8kRow<'_>; N],
    paths: [GgmlPath; N],
) -> [f32; N] {
    let nb = w.len() / q6_k::BYTES;
    assert_eq!(w.len(), nb * q6_k::BYTES);
    for r in &x {
        assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * QK_K / 16);
    }
    assert!(paths
        .iter()
        .all(|p| matches!(p, GgmlPath::VecDot | GgmlPath::Tiled)));
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x03);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc1 = [0f32; N];
    for ib in 0..nb {
        let blk = &w[ib * q6_k::BYTES..(ib + 1) * q6_k::BYTES];
        let dw = f16x1(blk.as_ptr().add(208));
        let sc: [i16; 16] = std::array::from_fn(|i| i16::from(blk[192 + i] as i8));
        // the 256 unsigned quants, 32 per group g (= sub-blocks 2g, 2g+1), and each group's scales
        let mut q6 = [_mm256_setzero_si256(); 8];
        let mut scv = [_mm256_setzero_si256(); 8];
        for half in 0..2 {
            let p = blk.as_ptr();
            let ql0 = _mm256_loadu_si256(p.add(64 * half) as *const __m256i);
            let ql1 = _mm256_loadu_si256(p.add(64 * half + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * half) as *const __m256i);
            let hi = |shift: i32| -> __m256i {
                let h = match shift {
                    0 => qh,
                    2 => _mm256_srli_epi16(qh, 2),
                    4 => _mm256_srli_epi16(qh, 4),
                    _ => _mm256_srli_epi16(qh, 6),
                };
                _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)
            };
            let lo0 = _mm256_and_si256(ql0, m4);
            let lo1 = _mm256_and_si256(ql1, m4);
            let up0 = _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4);
            let up1 = _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4);
            q6[4 * half] = _mm256_or_si256(lo0, hi(0));
            q6[4 * half + 1] = _mm256_or_si256(lo1, hi(2));
            q6[4 * half + 2] = _mm256_or_si256(up0, hi(4));
            q6[4 * half + 3] = _mm256_or_si256(up1, hi(6));
        }
        for (g, v) in scv.iter_mut().enumerate() {
            *v = _mm256_set_m128i(_mm_set1_epi16(sc[2 * g + 1]), _mm_set1_epi16(sc[2 * g]));
        }
        for j in 0..N {
            let r = &x[j];
            let qy = r.qs.as_ptr().add(ib * QK_K);
            let bsums = &r.bsums[ib * QK_K / 16..(ib + 1) * QK_K / 16];
            let dy = *r.d.get_unchecked(ib);
            let mut lanes = _mm256_setzero_si256();
            for g in 0..8 {
                let y = _mm256_loadu_si256(qy.add(32 * g) as *const __m256i);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q6[g], y), scv[g]);
                lanes = _mm256_add_epi32(lanes, p);
            }
            let off: [i32; 8] = std::array::from_fn(|l| {
                (i32::from(bsums[2 * l]) * i32::from(sc[2 * l])
                    + i32::from(bsums[2 * l + 1]) * i32::from(sc[2 * l + 1]))
                    << 5
            });
            let off = _mm256_loadu_si256(off.as_ptr() as *const __m256i);
            let lanes = _mm256_sub_epi32(lanes, off);
            match paths[j] {
                GgmlPath::Tiled => {
                    let s1 = hsum_i32_8(lanes) as f32;
                    acc1[j] = (dw * s1).mul_add(dy, acc1[j]);
                }
                _ => {
                    let d = _mm256_set1_ps(dy * dw);
                    acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[j]);
                }
            }
        }
    }
    let mut out = [0f32; N];
    for j in 0..N {
        out[j] = match paths[j] {
            GgmlPath::Tiled => acc1[j],
            _ => hsum_float_8(acc[j]),
        };
    }
    out
}

pub(crate) mod kquant;
pub(crate) mod ktile8;

#[cfg(test)]
mod tests;
