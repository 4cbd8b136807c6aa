//! AVX-512 VNNI tiles: the AVX2 kernels of [`super::avx2`] for Q4_1, Q5_0 and Q8_0 weights with the
//! integer block products done by `vpdpbusd` on 256-bit vectors (AVX-512 F, BW, VL, VNNI), for
//! [`crate::numerics::Simd::Avx512`].
//!
//! What they mirror, and why the bits are the AVX2 kernels' (and llama.cpp's): every output is
//! `hsum_float_8(acc)` (+ `summs` for Q4_1) of one eight-lane accumulator updated once per 32-element block
//! with `acc = fma(d_w · d_x, lane, acc)`, where lane `l` is the exact integer dot of elements
//! `4l .. 4l+4`. ggml-cpu's x86 kernels (`ggml_vec_dot_q8_0_q8_0`, `_q5_0_q8_0`, `_q4_1_q8_1` in
//! `arch/x86/quants.c`, and `tinyBLAS_Q0_AVX` in `llamafile/sgemm.cpp`) compute those lanes with
//! `maddubs`/`madd` on AVX2 and with `_mm256_dpbusd_epi32` when built with `__AVX512VNNI__`; both are
//! exact, so the lanes are the same integers. Only the way to the integers differs here:
//!
//! - **Signed weights × signed activations (Q8_0, Q5_0)**: ggml makes the product unsigned × signed with
//!   `_mm256_sign_epi8` (`|w|` and `sign(a, w)`), one extra instruction per weight block and activation
//!   row. These tiles use the offset form instead: `Σ w·a = Σ w·(a+128) − 128·Σ w`, with `a + 128` made
//!   once per activation row ([`super::PreparedRow`]'s `qu`) and `−128·Σ w` once per weight block, as the
//!   `vpdpbusd` accumulator's starting value. Both are exact for every quant except an activation quant of
//!   −128 (only a NaN input produces one), where ggml's `sign` form wraps; rows with one go to the AVX2
//!   kernel, which reproduces the wrap.
//! - **Unsigned nibbles × signed activations (Q4_1)**: `vpdpbusd` takes them as they are (4·15·127 fits
//!   an i32; `maddubs` could not saturate either: 2·15·127 < 2¹⁵).
//!
//! The scales `d_w · d_x` of one weight block and the call's (up to eight) activation rows are one
//! `vmulps` on the rows' transposed scales ([`Tile`]; every lane the same f32 product as ggml's
//! `_mm256_set1_ps(d_w * d_x)`), made for the whole weight row first and read back with broadcast loads
//! (no shuffle); Q4_1's `summs` chains are the lanes of one vector likewise. One activation block then
//! costs two loads, `vpdpbusd`, `vcvtdq2ps` and the fma. The two-row Q8_0 tile (the prefill workhorse)
//! makes its products per block inside the loop instead and picks each row's lane with `vpermps`.
//!
//! Every function here is `unsafe`: the caller must have checked [`available`], and the slices must hold
//! whole blocks of matching length (checked with `assert!`).

use std::arch::x86_64::*;

use super::avx2::{bytes_from_bits_32, bytes_from_nibbles_32, f16x1, f16x2, hsum_float_8};
use super::fp::read_f16;
use super::q8::{Q8_0_BYTES, QK};
use super::{q4_1, q5_0};

/// The activation rows of one kernel call, as the tiles read them: up to [`LANES`] rows of quants (offset
/// to unsigned, `q + 128`, for the signed-weight tiles; as stored for Q4_1) and their per-block scales
/// transposed, `d[ib · LANES + j]` = row `j`'s `d` of block `ib` (and `s` likewise, Q8_1), so that the
/// scales of every row of one block are one vector.
pub(crate) struct Tile<'a, const N: usize> {
    pub qs: [&'a [u8]; N],
    pub d: &'a [f32],
    pub s: &'a [f32],
}

/// Activation rows per [`Tile`] at most, and the stride of its transposed scales.
pub(crate) const LANES: usize = 8;

/// `−128 · Σ w` over each group of four signed bytes of `w` (exact i32 lanes): the starting value that
/// turns `vpdpbusd(·, a + 128, w)` into `Σ a·w`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn offset_correction(w: __m256i) -> __m256i {
    let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), w);
    _mm256_sub_epi32(_mm256_setzero_si256(), s)
}

/// `prod[ib · LANES + j] = d_w[ib] · d[ib · LANES + j]` for every block of the row (one `vmulps` per
/// block, every lane ggml's f32 product `d_w * d_x`): the kernels then read each row's scale with a
/// broadcast load, which costs no shuffle.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn scale_products(dw: impl Fn(usize) -> f32, d: &[f32], nb: usize, prod: &mut [f32]) {
    assert!(d.len() >= nb * LANES && prod.len() >= nb * LANES);
    for ib in 0..nb {
        let v = _mm256_mul_ps(
            _mm256_set1_ps(dw(ib)),
            _mm256_loadu_ps(d.as_ptr().add(ib * LANES)),
        );
        _mm256_storeu_ps(prod.as_mut_ptr().add(ib * LANES), v);
    }
}

/// Check the tile holds `nb` blocks of `QK` quants per row and `nb` transposed scales.
fn check_tile<const N: usize>(x: &Tile<'_, N>, nb: usize, with_s: bool) {
    assert!(N <= LANES);
    assert!(x.d.len() >= nb * LANES && (!with_s || x.s.len() >= nb * LANES));
    for q in &x.qs {
        assert!(q.len() >= nb * QK);
    }
}

/// The `N` accumulator updates of one signed weight block `qw` against block `ib` of the tile's offset
/// rows, with the scale products `prod` of [`scale_products`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn signed_block<const N: usize>(
    qw: __m256i,
    x: &Tile<'_, N>,
    prod: &[f32],
    ib: usize,
    acc: &mut [__m256; N],
) {
    let corr = offset_correction(qw);
    #[allow(clippy::needless_range_loop)] // j indexes the rows, their accumulators and scales alike
    for j in 0..N {
        let qa = _mm256_loadu_si256(x.qs[j].as_ptr().add(ib * QK) as *const __m256i);
        let l = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(corr, qa, qw));
        let d = _mm256_set1_ps(*prod.get_unchecked(ib * LANES + j));
        acc[j] = _mm256_fmadd_ps(d, l, acc[j]);
    }
}

/// `ggml_vec_dot_q8_0_q8_0` / `tinyBLAS_Q0_AVX` for one Q8_0 weight row against the tile's `N` offset
/// activation rows (module docs): every output has the bits of `avx2::dot_q8_0_q8_0` (and of the scalar
/// `q8::dot_q8_0_q8_0`) for rows without a −128 quant.
///
/// # Safety
/// [`available`] must be true; `w` holds `nb` Q8_0 blocks and the tile `nb` blocks (checked).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q8_0_q8_0<const N: usize>(
    w: &[u8],
    x: &Tile<'_, N>,
    prod: &mut [f32],
) -> [f32; N] {
    let nb = w.len() / Q8_0_BYTES;
    assert_eq!(w.len(), nb * Q8_0_BYTES);
    check_tile(x, nb, false);
    scale_products(|ib| f16x1(w.as_ptr().add(ib * Q8_0_BYTES)), x.d, nb, prod);
    let mut acc = [_mm256_setzero_ps(); N];
    for ib in 0..nb {
        let blk = w.as_ptr().add(ib * Q8_0_BYTES);
        let qw = _mm256_loadu_si256(blk.add(2) as *const __m256i);
        signed_block(qw, x, prod, ib, &mut acc);
    }
    hsums(&acc)
}

/// [`dot_q8_0_q8_0`] for two weight rows at once (each activation block is loaded once for both): every
/// output has that function's bits. The scale products of a block are made in the loop, one `vmulps` per
/// row for the tile's rows, each token's read back as a broadcast (no separate products pass:
/// measured ~5% faster on a SmolLM2 Q8_0 prompt, where a weight row's first touch would otherwise stall
/// a separate products pass).
///
/// # Safety
/// As [`dot_q8_0_q8_0`], for both rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q8_0_q8_0_x2<const N: usize>(
    w: [&[u8]; 2],
    x: &Tile<'_, N>,
) -> [[f32; N]; 2] {
    let nb = w[0].len() / Q8_0_BYTES;
    assert!(w[0].len() == nb * Q8_0_BYTES && w[1].len() == nb * Q8_0_BYTES);
    check_tile(x, nb, false);
    let mut acc = [[_mm256_setzero_ps(); N]; 2];
    for ib in 0..nb {
        let (b0, b1) = (
            w[0].as_ptr().add(ib * Q8_0_BYTES),
            w[1].as_ptr().add(ib * Q8_0_BYTES),
        );
        let qw = [
            _mm256_loadu_si256(b0.add(2) as *const __m256i),
            _mm256_loadu_si256(b1.add(2) as *const __m256i),
        ];
        signed_block_x2(qw, [f16x1(b0), f16x1(b1)], x, ib, &mut acc);
    }
    hsums_x2(&acc)
}

/// `hsum_float_8` of every accumulator (a plain loop: a closure would be compiled without this module's
/// features and called per accumulator, 2.7% of a single-thread Q8_0 prompt).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn hsums<const N: usize>(acc: &[__m256; N]) -> [f32; N] {
    let mut out = [0f32; N];
    for (o, &a) in out.iter_mut().zip(acc) {
        *o = hsum_float_8(a);
    }
    out
}

/// [`hsums`] of both rows of a two-row tile.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn hsums_x2<const N: usize>(acc: &[[__m256; N]; 2]) -> [[f32; N]; 2] {
    [hsums(&acc[0]), hsums(&acc[1])]
}

/// The `2·N` accumulator updates of two signed weight blocks `qw` (scales `dw`) against block `ib` of the
/// tile's offset rows: `acc[r][j] = fma(dw[r]·d_j, Σ qw[r]·a_j, acc[r][j])`, the products made here, one
/// `vmulps` per row for the tile's rows, each token's read back as a broadcast (no separate products
/// pass: measured ~5% faster on a SmolLM2 Q8_0 prompt, where a weight row's first touch would otherwise
/// stall a separate products pass).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn signed_block_x2<const N: usize>(
    qw: [__m256i; 2],
    dw: [f32; 2],
    x: &Tile<'_, N>,
    ib: usize,
    acc: &mut [[__m256; N]; 2],
) {
    let (c0, c1) = (offset_correction(qw[0]), offset_correction(qw[1]));
    let xd = _mm256_loadu_ps(x.d.as_ptr().add(ib * LANES));
    let p0 = _mm256_mul_ps(_mm256_set1_ps(dw[0]), xd);
    let p1 = _mm256_mul_ps(_mm256_set1_ps(dw[1]), xd);
    // through memory, so that each token's scale is an embedded broadcast of the fma (`{1to8}`, a load)
    // rather than a `vpermps` on the vector pipes (black_box keeps the compiler from forwarding the
    // stores into shuffles): 2% of a single-thread Q8_0 prompt
    let mut pb = [0f32; 16];
    _mm256_storeu_ps(pb.as_mut_ptr(), p0);
    _mm256_storeu_ps(pb.as_mut_ptr().add(8), p1);
    let pb = std::hint::black_box(&pb);
    #[allow(clippy::needless_range_loop)]
    // j indexes the rows, their accumulators and scales alike
    for j in 0..N {
        let qa = _mm256_loadu_si256(x.qs[j].as_ptr().add(ib * QK) as *const __m256i);
        let l0 = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(c0, qa, qw[0]));
        let l1 = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(c1, qa, qw[1]));
        let d0 = _mm256_broadcast_ss(&pb[j]);
        let d1 = _mm256_broadcast_ss(&pb[8 + j]);
        acc[0][j] = _mm256_fmadd_ps(d0, l0, acc[0][j]);
        acc[1][j] = _mm256_fmadd_ps(d1, l1, acc[1][j]);
    }
}

/// The 32 signed 5-bit values of the Q5_0 block at `blk` as bytes (`bytes_from_nibbles_32` OR'd with
/// `0xF0` where the high bit is clear, as `avx2::dot_q5_0_q8_0` and ggml's AVX2 branch unpack them).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q5_0_values(blk: *const u8) -> __m256i {
    let bxhi = _mm256_andnot_si256(bytes_from_bits_32(blk.add(2)), _mm256_set1_epi8(-16));
    _mm256_or_si256(bytes_from_nibbles_32(blk.add(6)), bxhi)
}

/// [`dot_q5_0_q8_0`] for two weight rows at once, as [`dot_q8_0_q8_0_x2`]: every output has that
/// function's bits.
///
/// # Safety
/// As [`dot_q5_0_q8_0`], for both rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q5_0_q8_0_x2<const N: usize>(
    w: [&[u8]; 2],
    x: &Tile<'_, N>,
) -> [[f32; N]; 2] {
    let nb = w[0].len() / q5_0::BYTES;
    assert!(w[0].len() == nb * q5_0::BYTES && w[1].len() == nb * q5_0::BYTES);
    check_tile(x, nb, false);
    let mut acc = [[_mm256_setzero_ps(); N]; 2];
    for ib in 0..nb {
        let (b0, b1) = (
            w[0].as_ptr().add(ib * q5_0::BYTES),
            w[1].as_ptr().add(ib * q5_0::BYTES),
        );
        let qw = [q5_0_values(b0), q5_0_values(b1)];
        signed_block_x2(qw, [f16x1(b0), f16x1(b1)], x, ib, &mut acc);
    }
    hsums_x2(&acc)
}

/// `ggml_vec_dot_q5_0_q8_0` / `tinyBLAS_Q0_AVX` for one Q5_0 weight row against the tile's `N` offset
/// activation rows: the signed 5-bit values are unpacked as `avx2::dot_q5_0_q8_0` does
/// (`bytes_from_nibbles_32` OR'd with `0xF0` where the high bit is clear); every output has that kernel's
/// bits for rows without a −128 quant.
///
/// # Safety
/// [`available`] must be true; `w` holds `nb` Q5_0 blocks and the tile `nb` blocks (checked).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q5_0_q8_0<const N: usize>(
    w: &[u8],
    x: &Tile<'_, N>,
    prod: &mut [f32],
) -> [f32; N] {
    let nb = w.len() / q5_0::BYTES;
    assert_eq!(w.len(), nb * q5_0::BYTES);
    check_tile(x, nb, false);
    scale_products(|ib| f16x1(w.as_ptr().add(ib * q5_0::BYTES)), x.d, nb, prod);
    let mut acc = [_mm256_setzero_ps(); N];
    for ib in 0..nb {
        let qw = q5_0_values(w.as_ptr().add(ib * q5_0::BYTES));
        signed_block(qw, x, prod, ib, &mut acc);
    }
    hsums(&acc)
}

/// `ggml_vec_dot_q4_1_q8_1` for one Q4_1 weight row against the tile's `N` Q8_1 activation rows, the
/// nibbles × quants as `vpdpbusd` (ggml's `mul_sum_us8_pairs_float` under `__AVX512VNNI__`): per block
/// and row `summs += m_w · s_x` (one fma; the rows' `summs` are the lanes of one vector) and
/// `acc = fma(d_w · d_x, lane, acc)`; result `hsum_float_8(acc) + summs`. Every output has the bits of
/// `avx2::dot_q4_1_q8_1` and `q4_1::dot_q8_1`.
///
/// # Safety
/// [`available`] must be true; `w` holds `nb` Q4_1 blocks and the tile `nb` Q8_1 blocks (checked).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q4_1_q8_1<const N: usize>(
    w: &[u8],
    x: &Tile<'_, N>,
    prod: &mut [f32],
) -> [f32; N] {
    let nb = w.len() / q4_1::BYTES;
    assert_eq!(w.len(), nb * q4_1::BYTES);
    check_tile(x, nb, true);
    scale_products(|ib| f16x1(w.as_ptr().add(ib * q4_1::BYTES)), x.d, nb, prod);
    let m_at = q4_1::min_offset();
    let mut acc = [_mm256_setzero_ps(); N];
    let mut summs = _mm256_setzero_ps();
    for ib in 0..nb {
        let blk = w.as_ptr().add(ib * q4_1::BYTES);
        let mw = if m_at == 2 {
            f16x2(blk).1
        } else {
            read_f16(std::slice::from_raw_parts(blk, 4), m_at)
        };
        let sv = _mm256_loadu_ps(x.s.as_ptr().add(ib * LANES));
        summs = _mm256_fmadd_ps(_mm256_set1_ps(mw), sv, summs);
        let qw = bytes_from_nibbles_32(blk.add(4));
        #[allow(clippy::needless_range_loop)]
        // j indexes the rows, their accumulators and scales alike
        for j in 0..N {
            let qa = _mm256_loadu_si256(x.qs[j].as_ptr().add(ib * QK) as *const __m256i);
            let l = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), qw, qa));
            let d = _mm256_set1_ps(*prod.get_unchecked(ib * LANES + j));
            acc[j] = _mm256_fmadd_ps(d, l, acc[j]);
        }
    }
    let mut s = [0f32; LANES];
    _mm256_storeu_ps(s.as_mut_ptr(), summs);
    let mut out = [0f32; N];
    #[allow(clippy::needless_range_loop)] // j indexes the rows, their accumulators and scales alike
    for j in 0..N {
        out[j] = hsum_float_8(acc[j]) + s[j];
    }
    out
}

pub(crate) mod kquant;

/// [`super::avx2::dot_q4_0_repacked_rows8`] (Q4_0 / IQ4_NL, `values` the nibble table; a decode step's
/// eight weight rows against one activation row) with each row-block's eight i32 lanes from one
/// `vpdpbusd` instead of ggml's `sign` / `maddubs` / `madd` sequence: the table shifted to unsigned
/// (`v + 128`) times the activation quants, on an accumulator started at `-128 ·` the same lanes'
/// activation sums — lane by lane the exact integer `Σ v·y` of those four elements, which the
/// `maddubs` + `madd` form also computes exactly (its i16 pair sums, at most 2·127·127, cannot saturate).
/// Where `sign` would wrap — a −128 activation quant, which only a NaN input produces — the two forms
/// differ, so the caller must not pass such a row (`PreparedRow::has_min_quant`).
///
/// Two blocks of every row go through one 512-bit `vpdpbusd` (the two blocks' 64 activation quants are
/// adjacent), and the sixteen row-block sums of a block pair come out of one transpose-and-add tree
/// ([`hsum_i32_8x8x2`]): about 7 instructions per row-block instead of 11 (8–22% faster on a matrix in
/// cache; a decode step from memory gains less, its eight row streams bound it). The float steps are
/// that kernel's: per row
/// `acc = fma(isum, d_w·d_x, acc)` once per block, in block order (an odd last block on its own), so
/// the same bits.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI; `w` holds eight rows of `nb` blocks and `x`
/// `nb` blocks (checked).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q4_0_repacked_rows8(
    w: &[u8],
    x: super::avx2::Q8Row<'_>,
    values: &[i8; 16],
) -> [f32; 8] {
    use super::avx2::{rows8_block_fma, rows8_scales};
    use super::q4_0::BYTES;
    let row_bytes = w.len() / 8;
    let nb = row_bytes / BYTES;
    assert_eq!(w.len(), 8 * nb * BYTES);
    assert!(x.qs.len() >= nb * QK && x.d.len() >= nb);
    let w: [*const u8; 8] = std::array::from_fn(|r| w.as_ptr().add(r * row_bytes));
    let lut128 = _mm_xor_si128(
        _mm_loadu_si128(values.as_ptr() as *const __m128i),
        _mm_set1_epi8(-128),
    );
    let lut = _mm256_set_m128i(lut128, lut128);
    let lut512 = _mm512_broadcast_i32x4(lut128);
    let m4 = _mm512_set1_epi8(0x0F);
    // [qs0, qs0 >> 4, qs1, qs1 >> 4] in 128-bit lanes, from `q` = [qs0, qs1] and `q >> 4` (qwords 8..)
    let spread = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
    let mut acc = _mm256_setzero_ps();
    let mut ib = 0;
    while ib + 2 <= nb {
        let qy = _mm512_loadu_si512(x.qs.as_ptr().add(ib * QK) as *const __m512i);
        // -128 · (the four-element sums of both blocks' quants), lane by lane
        let corr = _mm512_sub_epi32(
            _mm512_setzero_si512(),
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(-128), qy),
        );
        let dw = _mm256_set_m128i(rows8_scales(&w, ib + 1), rows8_scales(&w, ib));
        let m: [__m512i; 8] = std::array::from_fn(|r| {
            let blk = w[r].add(ib * BYTES);
            // the same blocks of the next eight rows, as the AVX2 kernel does (see there); 36 bytes a
            // step, so every cache line of them is asked for
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(8 * row_bytes) as *const i8);
            let q = _mm256_loadu2_m128i(
                blk.add(BYTES + 2) as *const __m128i,
                blk.add(2) as *const __m128i,
            );
            let h = _mm256_srli_epi16(q, 4);
            let z = _mm512_permutex2var_epi64(
                _mm512_castsi256_si512(q),
                spread,
                _mm512_castsi256_si512(h),
            );
            let qw = _mm512_shuffle_epi8(lut512, _mm512_and_si512(z, m4));
            _mm512_dpbusd_epi32(corr, qw, qy)
        });
        let isum = _mm512_cvtepi32_ps(hsum_i32_8x8x2(&m));
        let dx = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castps_pd(_mm512_set1_ps(*x.d.get_unchecked(ib))),
            _mm256_castps_pd(_mm256_set1_ps(*x.d.get_unchecked(ib + 1))),
        ));
        let d = _mm512_mul_ps(_mm512_cvtph_ps(dw), dx);
        acc = _mm256_fmadd_ps(_mm512_castps512_ps256(isum), _mm512_castps512_ps256(d), acc);
        acc = _mm256_fmadd_ps(upper_ps(isum), upper_ps(d), acc);
        ib += 2;
    }
    if ib < nb {
        let k128 = _mm256_set1_epi8(-128);
        let qy = _mm256_loadu_si256(x.qs.as_ptr().add(ib * QK) as *const __m256i);
        let corr = _mm256_sub_epi32(
            _mm256_setzero_si256(),
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), k128, qy),
        );
        let m: [__m256i; 8] = std::array::from_fn(|r| {
            let qw = _mm256_shuffle_epi8(lut, bytes_from_nibbles_32(w[r].add(ib * BYTES + 2)));
            _mm256_dpbusd_epi32(corr, qw, qy)
        });
        acc = rows8_block_fma(&m, rows8_scales(&w, ib), *x.d.get_unchecked(ib), acc);
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// The upper eight lanes of `v`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn upper_ps(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
}

/// Two blocks' row sums at once: `m[r]` holds row `r`'s eight i32 lanes of block 0 in its lower half and
/// of block 1 in its upper half; lane `b·8 + r` of the result is the sum of block `b`'s lanes of row `r`
/// (exact integers: the order of the adds does not matter; wrapping as `vpaddd`). A transpose-and-add
/// tree: rows paired within 128-bit lanes (`unpack*_epi32`, then `unpack*_epi64`), then the 128-bit
/// halves of each block added across rows 0–3 and 4–7 (`vpermt2q`) — 21 instructions for 16 sums.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn hsum_i32_8x8x2(m: &[__m512i; 8]) -> __m512i {
    // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    let pair32 = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    // per 128-bit lane: the four rows' sums of that lane's four elements
    let pair64 = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    let r0123 = pair64(pair32(m[0], m[1]), pair32(m[2], m[3]));
    let r4567 = pair64(pair32(m[4], m[5]), pair32(m[6], m[7]));
    // 128-bit lanes of r0123 / r4567: block 0's elements 0-3 and 4-7, block 1's 0-3 and 4-7
    let even = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
    let odd = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    _mm512_add_epi32(
        _mm512_permutex2var_epi64(r0123, even, r4567),
        _mm512_permutex2var_epi64(r0123, odd, r4567),
    )
}
