//! AVX-512 VNNI tiles of the repacked 4-bit gemm (Q4_0, IQ4_NL weights with Q8_0 activations): sixteen
//! weight rows in the sixteen lanes of one 512-bit vector against sixteen prompt tokens, for
//! [`crate::numerics::Simd::Avx512`].
//!
//! What they compute: llama.cpp repacks Q4_0 and IQ4_NL weights whose row count is a multiple of 8
//! (`q4_0_8x8_q8_0`, `iq4_nl_8x8_q8_0`, ggml-cpu/repack.cpp) and runs a prompt's rows in groups of 4
//! through `ggml_gemm_q4_0_8x8_q8_0` / `ggml_gemm_iq4_nl_8x8_q8_0` (arch/x86/repack.cpp, their AVX-512
//! branch on this build; [`GgmlPath::RepackGemm`]). Per output and block that is one exact integer dot
//! `isum` of the 32 weight values with the activation quants (plain products: the gemm passes the
//! activation first, so no sign trick), then `acc = fma(isum, d_w·d_x, acc)` on one accumulator, blocks
//! in order (`q4_0::dot_q8_0_repacked_lut` with `gemv = false` spells it out). These tiles get the same
//! integers another way and do the same two f32 operations, lane by lane:
//!
//! - **Weights in lanes.** For each block, the sixteen rows' 16 bytes of nibbles are transposed (4×4
//!   dwords within each 128-bit lane) so that vector `g` holds bytes `4g .. 4g+4` of every row, row `r`
//!   in lane `r`; masking and shifting gives the unsigned codes of elements `4g .. 4g+4` (low nibbles)
//!   and `16+4g .. 16+4g+4` (high nibbles); IQ4_NL maps them through `vpshufb` to `value + 128`.
//! - **Activations broadcast.** `vpdpbusd(isum, codes_g, broadcast(4 quants of token t))` adds four
//!   exact products per row lane; eight of them give `Σ code·a` of the block for sixteen rows at once.
//!   The integer dot is then `Σ code·a − bias·Σ a` (bias 8 for Q4_0, whose value is `code − 8`; 128 for
//!   IQ4_NL, whose code is `value + 128`): exact for every activation quant, −128 included, so every
//!   group of tokens on the gemm path is tiled. `−bias·Σ a` per token and block is made once per matmul
//!   in the tile ([`build_tile`]) and is the starting value of `isum`.
//! - **The f32 steps** are the spec's: `d_w·d_x` (one `vmulps` of the sixteen rows' `d` by the token's
//!   broadcast `d`), `acc = fma(f32(isum), d_w·d_x, acc)`; `f32(isum)` is exact (|isum| ≤ 32·128·128).
//!   A token's sixteen outputs are one store.
//!
//! The activation side ([`build_tile`], one tile per group of [`TOKENS`] tokens, made once per matmul)
//! holds per block the tokens' 32 quants (token `t` at byte `32t`, eight lines), one line of `−bias·Σ a`
//! (i32 lane `t`) and one of `d_x` (f32 lane `t`): 640 bytes a block, so that the tile of a row of up to
//! ~1500 elements stays in L1 while the weight rows stream past it.
//!
//! The kernels are `unsafe`: the CPU must have AVX2, FMA, F16C and AVX-512 F, BW, VL, VNNI (a
//! [`super::SimdKernel`] of the `Avx512` kind exists only then); lengths are checked with `assert!`.

use super::ktile::Line;
use super::q8::QK;
use super::{iq4_nl, GgmlPath, GgmlType, PreparedRow};

/// Tokens per tile.
pub(crate) const TOKENS: usize = 16;
/// Lines of quants per block: 32 quants of each of the sixteen tokens.
const Q_LINES: usize = TOKENS * QK / 64;
/// The line of the tokens' `−bias·Σ a` (i32 lanes) within a block's lines.
const CORR_LINE: usize = Q_LINES;
/// The line of the tokens' `d` (f32 lanes) within a block's lines.
const D_LINE: usize = CORR_LINE + 1;
/// Lines per block of a tile.
const LINES_PER_BLOCK: usize = D_LINE + 1;

/// Lines of the tile of activation rows of `nb` blocks of 32.
pub(crate) fn tile_lines(nb: usize) -> usize {
    nb * LINES_PER_BLOCK
}

/// True if these tiles compute weights of `ty` on ggml path `path`: Q4_0 and IQ4_NL on the repacked
/// gemm (module docs).
pub(crate) fn handles(ty: GgmlType, path: GgmlPath) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::IQ4_NL) && path == GgmlPath::RepackGemm
}

/// The unsigned code of each nibble and the bias that turns it into the weight value
/// (`value = code − bias`): Q4_0 the nibble itself and 8, IQ4_NL `kvalues_iq4nl + 128` and 128.
///
/// # Panics
/// For another type: a caller's bug.
fn codes(ty: GgmlType) -> ([u8; 16], i32) {
    match ty {
        GgmlType::Q4_0 => (std::array::from_fn(|i| i as u8), 8),
        GgmlType::IQ4_NL => (iq4_nl::KVALUES.map(|v| (i32::from(v) + 128) as u8), 128),
        _ => panic!("no nibble tile for {ty}"),
    }
}

/// The tile of the [`TOKENS`] Q8_0 activation rows `xs` (prepared for weights of `ty`, Q4_0 or IQ4_NL)
/// in `out`, at least [`tile_lines`]`(nb)` lines (module docs for the layout).
///
/// # Panics
/// If `ty` is another type, the rows are not Q8_0 rows of one length, or `out` is too short: a caller's
/// bug (the backend prepares the rows for this weight type).
pub(crate) fn build_tile(ty: GgmlType, xs: [&PreparedRow; TOKENS], out: &mut [Line]) {
    let (_, bias) = codes(ty);
    let nb = xs[0].d.len();
    assert!(out.len() >= tile_lines(nb));
    for x in &xs {
        assert!(
            x.d.len() == nb && x.qs.len() >= nb * QK,
            "Q8_0 rows of one length"
        );
    }
    for (ib, lines) in out.chunks_exact_mut(LINES_PER_BLOCK).take(nb).enumerate() {
        let (quants, rest) = lines.split_at_mut(Q_LINES);
        for (t, x) in xs.iter().enumerate() {
            let q = &x.qs[ib * QK..(ib + 1) * QK];
            let line = &mut quants[t / 2].0[32 * (t % 2)..32 * (t % 2) + 32];
            for (b, &v) in line.iter_mut().zip(q) {
                *b = v as u8;
            }
            let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
            rest[0].0[4 * t..4 * t + 4].copy_from_slice(&(-bias * sum).to_le_bytes());
            rest[1].0[4 * t..4 * t + 4].copy_from_slice(&x.d[ib].to_le_bytes());
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use kernels::dot_rows;

#[cfg(target_arch = "x86_64")]
mod kernels {
    use std::arch::x86_64::*;

    use super::super::q4_0;
    use super::super::GgmlType;
    use super::{codes, Line, CORR_LINE, D_LINE, LINES_PER_BLOCK, TOKENS};

    /// Rows per step: the i32 lanes of one 512-bit vector.
    const ROWS: usize = 16;

    /// The sixteen rows' 16 bytes at `p[r] + off` as four vectors, vector `g` holding bytes
    /// `4g .. 4g+4` of row `r` in lane `r` (a 4×4 dword transpose within each 128-bit lane).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn transposed(p: &[*const u8; ROWS], off: usize) -> [__m512i; 4] {
        // z[k]: rows k, 4+k, 8+k, 12+k in its 128-bit lanes 0..3
        let z: [__m512i; 4] = std::array::from_fn(|k| {
            let v = _mm512_castsi128_si512(_mm_loadu_si128(p[k].add(off) as *const __m128i));
            let v =
                _mm512_inserti32x4::<1>(v, _mm_loadu_si128(p[4 + k].add(off) as *const __m128i));
            let v =
                _mm512_inserti32x4::<2>(v, _mm_loadu_si128(p[8 + k].add(off) as *const __m128i));
            _mm512_inserti32x4::<3>(v, _mm_loadu_si128(p[12 + k].add(off) as *const __m128i))
        });
        // dword k of 128-bit lane j of the results comes from z[k]: row 4j + k, lane 4j + k
        let t0 = _mm512_unpacklo_epi32(z[0], z[1]);
        let t1 = _mm512_unpackhi_epi32(z[0], z[1]);
        let t2 = _mm512_unpacklo_epi32(z[2], z[3]);
        let t3 = _mm512_unpackhi_epi32(z[2], z[3]);
        [
            _mm512_unpacklo_epi64(t0, t2),
            _mm512_unpackhi_epi64(t0, t2),
            _mm512_unpacklo_epi64(t1, t3),
            _mm512_unpackhi_epi64(t1, t3),
        ]
    }

    /// `outs[t][i]` = the output of weight row `i < n_rows` (rows of `row_bytes` bytes of `ty` = Q4_0
    /// or IQ4_NL blocks in `rows`) and token `t` of `tile` ([`super::build_tile`] for `ty`) on the
    /// repacked gemm: the bits of `q4_0::dot_q8_0_repacked_lut(.., gemv = false, ..)`. Sixteen weight
    /// rows per step (the last step's missing rows repeat its last row and are not stored).
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
        let (lut, _) = codes(ty);
        let lookup = ty != GgmlType::Q4_0;
        let bb = q4_0::BYTES; // IQ4_NL has Q4_0's block layout
        let nb = row_bytes / bb;
        assert_eq!(row_bytes, nb * bb, "whole blocks per row");
        assert!(rows.len() >= n_rows * row_bytes);
        assert!(
            tile.len() >= nb * LINES_PER_BLOCK,
            "a tile of the row length"
        );
        assert!(outs.iter().all(|o| o.len() >= n_rows));
        assert!(row_bytes * ROWS <= i32::MAX as usize, "row offsets fit i32");
        let lut = _mm512_broadcast_i32x4(_mm_loadu_si128(lut.as_ptr() as *const __m128i));
        let low = _mm512_set1_epi8(0x0F);
        let t = tile.as_ptr() as *const u8;
        let mut i = 0;
        while i < n_rows {
            let m = (n_rows - i).min(ROWS);
            // the step's rows; past the last row, the last row again
            let p: [*const u8; ROWS] =
                std::array::from_fn(|r| rows.as_ptr().add((i + r.min(m - 1)) * row_bytes));
            let offs = _mm512_loadu_si512(
                std::array::from_fn::<i32, ROWS, _>(|r| (r.min(m - 1) * row_bytes) as i32).as_ptr()
                    as *const _,
            );
            let mut acc = [_mm512_setzero_ps(); TOKENS];
            for ib in 0..nb {
                // the sixteen rows' d (the f16 in the low half of the gathered dwords)
                let dw = _mm512_i32gather_epi32::<1>(offs, p[0].add(ib * bb) as *const i32);
                let dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw));
                let q = transposed(&p, ib * bb + 2);
                // codes of elements 4g..4g+4 (w[g]) and 16+4g..16+4g+4 (w[4+g]) of every row
                let mut w = [_mm512_setzero_si512(); 8];
                for g in 0..4 {
                    w[g] = _mm512_and_si512(q[g], low);
                    w[4 + g] = _mm512_and_si512(_mm512_srli_epi16::<4>(q[g]), low);
                }
                if lookup {
                    for v in &mut w {
                        *v = _mm512_shuffle_epi8(lut, *v);
                    }
                }
                let lines = t.add(ib * LINES_PER_BLOCK * 64);
                let corr = lines.add(CORR_LINE * 64) as *const i32;
                let dx = lines.add(D_LINE * 64) as *const f32;
                for (tok, a) in acc.iter_mut().enumerate() {
                    let aq = lines.add(32 * tok) as *const i32;
                    let mut isum = _mm512_set1_epi32(*corr.add(tok));
                    for (g, &wg) in w.iter().enumerate() {
                        isum = _mm512_dpbusd_epi32(isum, wg, _mm512_set1_epi32(*aq.add(g)));
                    }
                    let d = _mm512_mul_ps(dw, _mm512_set1_ps(*dx.add(tok)));
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), d, *a);
                }
            }
            let mask: __mmask16 = if m == ROWS { !0 } else { (1u16 << m) - 1 };
            for (o, &a) in outs.iter_mut().zip(&acc) {
                // SAFETY: every output holds `n_rows ≥ i + m` floats (checked above)
                _mm512_mask_storeu_ps(o.as_mut_ptr().add(i), mask, a);
            }
            i += m;
        }
    }
}

#[cfg(test)]
mod tests;
