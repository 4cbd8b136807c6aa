//! AVX-512 VNNI pair tiles of the 32-blocks with Q8_0 activations (Q5_0, Q8_0 weights): two tokens in
//! the two halves of one 512-bit vector, sixteen tokens per call, for [`crate::numerics::Simd::Avx512`].
//!
//! The arithmetic is that of the 256-bit tiles of [`super::avx512`] (and so of `ggml_vec_dot_q5_0_q8_0`,
//! `ggml_vec_dot_q8_0_q8_0` and `tinyBLAS_Q0_AVX`, module docs there): per output one eight-lane f32
//! accumulator, updated once per block with `acc = fma(d_w · d_x, lane, acc)` where lane `l` is the exact
//! integer dot of elements `4l .. 4l+4` (here `vpdpbusd` in the offset form, `Σ w·(a+128) − 128·Σ w`),
//! and `hsum_float_8(acc)` at the end. The eight lanes of token `2P` sit in the low half of a 512-bit
//! accumulator and those of token `2P+1` in the high half, so one `vpdpbusd`, one `vcvtdq2ps`, one
//! `vpermps` (the two tokens' `d_w · d_x` out of the sixteen made by one `vmulps` per block and row, each
//! lane the same f32 product as ggml's) and one fma do the block update of two outputs: half the
//! instructions of the 256-bit tiles.
//!
//! The activation side is laid out once per matmul ([`build_tile`]): for each block, eight lines of the
//! offset quants of a token pair (`q + 128` of token `2P` in bytes 0..32, of token `2P+1` in 32..64) and
//! one line of the sixteen tokens' `d` (f32 lane `t`): 576 bytes a block, so that the tile of a row of
//! up to ~1000 elements stays in L1 while the weight rows stream past it. The offset form
//! is exact for every activation quant but −128 (only a NaN input gives one; ggml's sign form wraps
//! there): a group with such a row is not tiled ([`accepts`]) and runs the AVX2 kernels, which reproduce
//! the wrap.
//!
//! The kernels are `unsafe`: the CPU must have AVX2, FMA, F16C and AVX-512 F, BW, VL, VNNI; lengths are
//! checked with `assert!`.

use super::ktile::Line;
use super::q8::QK;
use super::PreparedRow;

/// Tokens per tile.
pub(crate) const TOKENS: usize = 16;
/// Token pairs per tile: the lines of quants (and of scales) per block.
const PAIRS: usize = TOKENS / 2;
/// Lines per block of a tile: the pairs' quants, then the tokens' scales.
const LINES_PER_BLOCK: usize = PAIRS + 1;

/// Lines of the tile of activation rows of `nb` blocks of 32.
pub(crate) fn tile_lines(nb: usize) -> usize {
    nb * LINES_PER_BLOCK
}

/// True if the rows `xs` can share a tile: no activation quant is −128 (module docs).
pub(crate) fn accepts(xs: &[&PreparedRow; TOKENS]) -> bool {
    !xs.iter().any(|x| x.has_min_quant)
}

/// The tile of the [`TOKENS`] Q8_0 activation rows `xs` (prepared for Q5_0 or Q8_0 weights, with
/// their offset quants `qu`) in `out`, at least [`tile_lines`]`(nb)` lines (module docs for the
/// layout).
///
/// # Panics
/// If the rows are not Q8_0 rows of one length with offset quants, or `out` is too short: a caller's
/// bug.
pub(crate) fn build_tile(xs: [&PreparedRow; TOKENS], out: &mut [Line]) {
    let nb = xs[0].d.len();
    assert!(out.len() >= tile_lines(nb));
    for x in &xs {
        assert!(
            x.d.len() == nb && x.qu.len() >= nb * QK,
            "Q8_0 rows with offset quants"
        );
    }
    for (ib, lines) in out.chunks_exact_mut(LINES_PER_BLOCK).take(nb).enumerate() {
        let (quants, scales) = lines.split_at_mut(PAIRS);
        for (p, q) in quants.iter_mut().enumerate() {
            for h in 0..2 {
                let x = xs[2 * p + h];
                q.0[32 * h..32 * h + 32].copy_from_slice(&x.qu[ib * QK..(ib + 1) * QK]);
            }
        }
        for (t, x) in xs.iter().enumerate() {
            scales[0].0[4 * t..4 * t + 4].copy_from_slice(&x.d[ib].to_le_bytes());
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use kernels::dot_rows;

#[cfg(target_arch = "x86_64")]
mod kernels {
    use std::arch::x86_64::*;

    use super::super::avx2::{bytes_from_bits_32, bytes_from_nibbles_32, f16x1, hsum_float_8};
    use super::super::q8::Q8_0_BYTES;
    use super::super::{q5_0, GgmlType};
    use super::{Line, LINES_PER_BLOCK, PAIRS, TOKENS};

    /// The signed weights of one block of `ty` at `blk`, in both 256-bit halves, and its `d`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn weights(ty: GgmlType, blk: *const u8) -> (__m512i, f32) {
        let q = if ty == GgmlType::Q5_0 {
            // as `avx2::dot_q5_0_q8_0`: the nibbles OR'd with 0xF0 where the high bit is clear
            let bxhi = _mm256_andnot_si256(bytes_from_bits_32(blk.add(2)), _mm256_set1_epi8(-16));
            _mm256_or_si256(bytes_from_nibbles_32(blk.add(6)), bxhi)
        } else {
            _mm256_loadu_si256(blk.add(2) as *const __m256i)
        };
        (_mm512_broadcast_i64x4(q), f16x1(blk))
    }

    /// `−128 · Σ w` over each group of four signed bytes of `w` (exact i32 lanes): the starting value
    /// that turns `vpdpbusd(·, a + 128, w)` into `Σ a·w`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn offset_correction(w: __m512i) -> __m512i {
        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(-128), w);
        _mm512_sub_epi32(_mm512_setzero_si512(), s)
    }

    /// The `vpermps` index of token pair `p`: lane `2p` in the low eight lanes, `2p + 1` in the high.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn pair_index(p: usize) -> __m512i {
        let (a, b) = (2 * p as i32, 2 * p as i32 + 1);
        _mm512_set_epi32(b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a)
    }

    /// `hsum_float_8` of both halves of every accumulator into `outs[2P][i]` and `outs[2P+1][i]`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn store(acc: &[__m512; PAIRS], outs: &mut [&mut [f32]; TOKENS], i: usize) {
        for (p, &a) in acc.iter().enumerate() {
            let lo = _mm512_castps512_ps256(a);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
            // SAFETY: every output holds more than `i` floats (`dot_rows` checked it)
            *outs[2 * p].get_unchecked_mut(i) = hsum_float_8(lo);
            *outs[2 * p + 1].get_unchecked_mut(i) = hsum_float_8(hi);
        }
    }

    /// `outs[t][i]` = the output of weight row `i < n_rows` (rows of `row_bytes` bytes of `ty` = Q5_0 or
    /// Q8_0 blocks in `rows`) and token `t` of `tile` ([`super::build_tile`]): the bits of
    /// `avx512::dot_q5_0_q8_0` / `dot_q8_0_q8_0` (and of the scalar kernels). Two weight rows per step,
    /// each line of the tile loaded once for both.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA, F16C and AVX-512 F, BW, VL, VNNI. Shapes are checked.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn dot_rows(
        ty: GgmlType,
        rows: &[u8],
        row_bytes: usize,
        n_rows: usize,
        tile: &[Line],
        outs: &mut [&mut [f32]; TOKENS],
    ) {
        let bb = match ty {
            GgmlType::Q5_0 => q5_0::BYTES,
            GgmlType::Q8_0 => Q8_0_BYTES,
            _ => panic!("no pair tile for {ty}"),
        };
        let nb = row_bytes / bb;
        assert_eq!(row_bytes, nb * bb, "whole blocks per row");
        assert!(rows.len() >= n_rows * row_bytes);
        assert!(
            tile.len() >= nb * LINES_PER_BLOCK,
            "a tile of the row length"
        );
        assert!(outs.iter().all(|o| o.len() >= n_rows));
        let t = tile.as_ptr();
        let mut i = 0;
        while i + 2 <= n_rows {
            let (r0, r1) = (
                rows.as_ptr().add(i * row_bytes),
                rows.as_ptr().add((i + 1) * row_bytes),
            );
            let mut acc0 = [_mm512_setzero_ps(); PAIRS];
            let mut acc1 = [_mm512_setzero_ps(); PAIRS];
            for ib in 0..nb {
                let (w0, d0) = weights(ty, r0.add(ib * bb));
                let (w1, d1) = weights(ty, r1.add(ib * bb));
                let (c0, c1) = (offset_correction(w0), offset_correction(w1));
                let lines = t.add(ib * LINES_PER_BLOCK);
                let dx = _mm512_load_ps(lines.add(PAIRS) as *const f32);
                let (p0, p1) = (
                    _mm512_mul_ps(_mm512_set1_ps(d0), dx),
                    _mm512_mul_ps(_mm512_set1_ps(d1), dx),
                );
                for p in 0..PAIRS {
                    let qa = _mm512_load_si512(lines.add(p) as *const _);
                    let l0 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c0, qa, w0));
                    let l1 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c1, qa, w1));
                    let ix = pair_index(p);
                    acc0[p] = _mm512_fmadd_ps(_mm512_permutexvar_ps(ix, p0), l0, acc0[p]);
                    acc1[p] = _mm512_fmadd_ps(_mm512_permutexvar_ps(ix, p1), l1, acc1[p]);
                }
            }
            store(&acc0, outs, i);
            store(&acc1, outs, i + 1);
            i += 2;
        }
        if i < n_rows {
            let r0 = rows.as_ptr().add(i * row_bytes);
            let mut acc0 = [_mm512_setzero_ps(); PAIRS];
            for ib in 0..nb {
                let (w0, d0) = weights(ty, r0.add(ib * bb));
                let c0 = offset_correction(w0);
                let lines = t.add(ib * LINES_PER_BLOCK);
                let dx = _mm512_load_ps(lines.add(PAIRS) as *const f32);
                let p0 = _mm512_mul_ps(_mm512_set1_ps(d0), dx);
                for (p, a) in acc0.iter_mut().enumerate() {
                    let qa = _mm512_load_si512(lines.add(p) as *const _);
                    let l0 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c0, qa, w0));
                    *a = _mm512_fmadd_ps(_mm512_permutexvar_ps(pair_index(p), p0), l0, *a);
                }
            }
            store(&acc0, outs, i);
        }
    }
}

#[cfg(test)]
mod tests;
