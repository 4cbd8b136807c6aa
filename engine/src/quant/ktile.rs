//! AVX-512 VNNI tiles of the K-quant prefill (Q4_K, Q6_K): sixteen prompt tokens in the sixteen i32
//! lanes of one 512-bit vector, for [`crate::numerics::Simd::Avx512`].
//!
//! What they compute, and why the bits are the scalar spec's: llama.cpp runs Q4_K weights through its
//! repacked gemm (`ggml_gemm_q4_K_8x8_q8_K`, arch/x86/repack.cpp; [`GgmlPath::RepackGemm`]) and Q6_K
//! (and Q4_K rows that were not repacked) through the tiled K-quant matmul (ggml-cpu/tiled;
//! [`GgmlPath::Tiled`]). Both round only in a few f32 operations per super-block of 256 and output;
//! everything before is exact integers (`q4_k::dot_q8_k_repacked` / `dot_q8_k_tiled`,
//! `q6_k::dot_q8_k_tiled` spell them out). These tiles get the same integers another way and then do
//! the same f32 operations, lane by lane:
//!
//! - **The activation side is transposed once per matmul** ([`build_tile`], one tile per group of
//!   [`TOKENS`] tokens): line `s` of super-block `ib` holds quants `4s .. 4s+4` of every token, token `t`
//!   in bytes `4t .. 4t+4`; then one line of the tokens' `d` (f32 lanes) and the bsums as i16 pairs.
//! - **One weight row at a time**, its super-block unpacked once into 256 unsigned bytes (Q4_K nibbles
//!   0..15, Q6_K 6-bit quants 0..63): `vpdpbusd(acc, broadcast(4 weight bytes), line)` adds four exact
//!   products per token lane, so eight (Q4_K, a sub-block of 32) or four (Q6_K, a sub-block of 16) of
//!   them give the integer dot of that sub-block with all sixteen tokens at once, no horizontal sums.
//!   Unsigned × signed is exact for every activation quant (−128 included): no sign trick needed.
//! - **Scales and mins** as exact integer arithmetic: Q4_K's `isum` of a pair of sub-blocks as
//!   `sc₀·D₀ + sc₁·D₁` in f32 (every term an integer below 2²⁴: |D| ≤ 32·15·128, sc ≤ 63, so each product
//!   and the sum are exact, the value the scalar spec converts from i32), the mins through `vpmaddwd`
//!   of the tokens' bsum pairs with `(m₀, m₁)`; Q6_K's `Σ sc·D − 32·Σ sc·bsum` (`vpmulld`, `vpmaddwd`,
//!   exact i32).
//! - **The f32 steps** are the scalar spec's, one lane per token: Q4_K gemm `acc = fma(isum_p, d_w·d_x,
//!   acc)`, `accm = fma(imin_p, dmin_w·d_x, accm)` for each pair `p` in order, result `acc − accm`; tiled
//!   `res = fma(−dmin_w, s2, d_w·s1)`, `acc = fma(res, d_x, acc)`; Q6_K `acc = fma(d_w·s1, d_x, acc)`.
//!
//! The kernels are `unsafe`: the CPU must have AVX2, FMA, F16C and AVX-512 F, BW, VL, VNNI (a
//! [`super::SimdKernel`] of the `Avx512` kind exists only then); lengths are checked with `assert!`.

use super::q8_k::QK_K;
use super::{GgmlPath, GgmlType, PreparedRow};

/// Tokens per tile: the i32 lanes of one 512-bit vector.
pub(crate) const TOKENS: usize = 16;

/// Lines of quants per super-block (four quants of every token per line).
const Q_LINES: usize = QK_K / 4;
/// The line of the tokens' `d` within a super-block's lines.
const D_LINE: usize = Q_LINES;
/// The first of the eight lines of bsum pairs within a super-block's lines.
const PAIR_LINE: usize = D_LINE + 1;
/// Lines per super-block of a tile: quants, `d`, eight lines of bsum pairs.
pub(crate) const LINES_PER_BLOCK: usize = PAIR_LINE + 8;

/// One 64-byte line of a tile (one 512-bit vector, aligned for it).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u8; 64]);

impl Default for Line {
    fn default() -> Self {
        Line([0; 64])
    }
}

/// Lines of the tile of activation rows of `nb` super-blocks.
pub(crate) fn tile_lines(nb: usize) -> usize {
    nb * LINES_PER_BLOCK
}

/// True if the tiles compute outputs of weight type `ty` on `path` (Q4_K repacked gemm or tiled, Q6_K
/// tiled); everything else stays with the AVX2 kernels.
pub(crate) fn handles(ty: GgmlType, path: GgmlPath) -> bool {
    matches!(
        (ty, path),
        (GgmlType::Q4_K, GgmlPath::RepackGemm | GgmlPath::Tiled)
            | (GgmlType::Q6_K, GgmlPath::Tiled)
    )
}

/// The tile of [`TOKENS`] Q8_K activation rows `xs` for weights of `ty` (Q4_K or Q6_K) in `out`
/// (at least [`tile_lines`]`(nb)` lines; module docs for the layout). Q4_K's eight pair lines hold
/// `(B[2p], B[2p+1])` in the first four, `B[g] = bsums[2g] + bsums[2g+1]` (the sum of a sub-block of
/// 32; at most 32·128 in magnitude, so an exact i16); Q6_K's `(bsums[2l], bsums[2l+1])`.
///
/// # Panics
/// If `ty` is another type, the rows are not Q8_K rows of one length, or `out` is too short: a caller's
/// bug (the backend prepares the rows for this weight type).
pub(crate) fn build_tile(ty: GgmlType, xs: [&PreparedRow; TOKENS], out: &mut [Line]) {
    assert!(matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K), "{ty}");
    let nb = xs[0].d.len();
    assert!(out.len() >= tile_lines(nb));
    for x in &xs {
        assert!(x.d.len() == nb && x.qs.len() >= nb * QK_K && x.bsums.len() >= nb * QK_K / 16);
    }
    for (ib, lines) in out.chunks_exact_mut(LINES_PER_BLOCK).take(nb).enumerate() {
        for (t, x) in xs.iter().enumerate() {
            let q = &x.qs[ib * QK_K..(ib + 1) * QK_K];
            for (s, line) in lines[..Q_LINES].iter_mut().enumerate() {
                for k in 0..4 {
                    line.0[4 * t + k] = q[4 * s + k] as u8;
                }
            }
            lines[D_LINE].0[4 * t..4 * t + 4].copy_from_slice(&x.d[ib].to_le_bytes());
            let bs = &x.bsums[ib * QK_K / 16..(ib + 1) * QK_K / 16];
            for (l, line) in lines[PAIR_LINE..].iter_mut().enumerate() {
                let (a, b) = match ty {
                    GgmlType::Q4_K if l < 4 => (
                        bs[4 * l].wrapping_add(bs[4 * l + 1]),
                        bs[4 * l + 2].wrapping_add(bs[4 * l + 3]),
                    ),
                    GgmlType::Q4_K => (0, 0),
                    _ => (bs[2 * l], bs[2 * l + 1]),
                };
                line.0[4 * t..4 * t + 2].copy_from_slice(&a.to_le_bytes());
                line.0[4 * t + 2..4 * t + 4].copy_from_slice(&b.to_le_bytes());
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use kernels::{dot_rows_q4_k, dot_rows_q6_k};

#[cfg(target_arch = "x86_64")]
mod kernels {
    use std::arch::x86_64::*;

    use super::super::avx2::{f16x1, f16x2};
    use super::super::{q4_k, q6_k};
    use super::{GgmlPath, Line, D_LINE, LINES_PER_BLOCK, PAIR_LINE, QK_K, TOKENS};

    /// 256 unpacked weight quants of one super-block, aligned for 256-bit stores.
    #[repr(C, align(64))]
    struct Unpacked([u8; QK_K]);

    /// Check the shapes shared by both kernels; returns the number of super-blocks per row.
    fn check(
        rows: &[u8],
        row_bytes: usize,
        n_rows: usize,
        block_bytes: usize,
        tile: &[Line],
        outs: &[&mut [f32]; TOKENS],
    ) -> usize {
        let nb = row_bytes / block_bytes;
        assert_eq!(row_bytes, nb * block_bytes, "whole super-blocks per row");
        assert!(rows.len() >= n_rows * row_bytes);
        assert!(
            tile.len() >= nb * LINES_PER_BLOCK,
            "a tile of the row length"
        );
        assert!(outs.iter().all(|o| o.len() >= n_rows));
        nb
    }

    /// `(lo, hi)` as the i16 pair of every i32 lane (`vpmaddwd`'s operand).
    #[inline]
    fn pair(lo: i16, hi: i16) -> i32 {
        (i32::from(hi) << 16) | i32::from(lo as u16)
    }

    /// The integer dots of the `steps` lines from `first` of super-block `xt` with the unpacked quants
    /// `w[r][4·first ..]` of `R` weight rows: lane `t` of row `r`'s = `Σ w·q8` of token `t` over those
    /// `4·steps` quants (exact). Each line is loaded once for all rows.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    #[allow(clippy::needless_range_loop)] // r indexes the rows' weights, scales and accumulators alike
    unsafe fn dot_lines<const R: usize>(
        w: &[Unpacked; R],
        xt: *const Line,
        first: usize,
        steps: usize,
    ) -> [__m512i; R] {
        let mut a = [_mm512_setzero_si512(); R];
        for s in first..first + steps {
            let x = _mm512_load_si512(xt.add(s) as *const _);
            for r in 0..R {
                let wv =
                    _mm512_set1_epi32((w[r].0.as_ptr().add(4 * s) as *const i32).read_unaligned());
                a[r] = _mm512_dpbusd_epi32(a[r], wv, x);
            }
        }
        a
    }

    /// Q4_K's `imin_p = m[2p]·B[2p] + m[2p+1]·B[2p+1]` of every token of super-block `xt` (exact i32).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn mins(xt: *const Line, m: &[u8; 8], p: usize) -> __m512i {
        _mm512_madd_epi16(
            _mm512_load_si512(xt.add(PAIR_LINE + p) as *const _),
            _mm512_set1_epi32(pair(i16::from(m[2 * p]), i16::from(m[2 * p + 1]))),
        )
    }

    /// Lane `t` of `r` into `outs[t][i]`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn store(r: __m512, outs: &mut [&mut [f32]; TOKENS], i: usize) {
        let mut v = [0f32; TOKENS];
        _mm512_storeu_ps(v.as_mut_ptr(), r);
        for (o, v) in outs.iter_mut().zip(v) {
            // SAFETY: every output holds `n_rows > i` floats (`check`)
            *o.get_unchecked_mut(i) = v;
        }
    }

    /// The nibbles of the Q4_K super-block `blk` into `w`: run `c` of 32 bytes holds sub-block `2c` in
    /// its low nibbles and `2c+1` in its high ones.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn unpack_q4(blk: &[u8], w: &mut Unpacked) {
        let m4 = _mm256_set1_epi8(0x0F);
        for c in 0..4 {
            let q = _mm256_loadu_si256(blk.as_ptr().add(16 + 32 * c) as *const __m256i);
            let out = w.0.as_mut_ptr().add(64 * c) as *mut __m256i;
            _mm256_store_si256(out, _mm256_and_si256(q, m4));
            _mm256_store_si256(out.add(1), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
        }
    }

    /// `outs[t][i]` = the Q4_K output of weight row `i < n_rows` (rows of `row_bytes` bytes in `rows`)
    /// and token `t` of `tile` ([`super::build_tile`]) on `path` (`RepackGemm` or `Tiled`): the bits of
    /// `q4_k::dot_q8_k_repacked(.., gemm = true)` resp. `q4_k::dot_q8_k_tiled` (module docs). Two rows
    /// per step (each tile line loaded once for both), an odd last one alone.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA, F16C and AVX-512 F, BW, VL, VNNI. Shapes are checked.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn dot_rows_q4_k(
        rows: &[u8],
        row_bytes: usize,
        n_rows: usize,
        tile: &[Line],
        path: GgmlPath,
        outs: &mut [&mut [f32]; TOKENS],
    ) {
        check(rows, row_bytes, n_rows, q4_k::BYTES, tile, outs);
        let gemm = match path {
            GgmlPath::RepackGemm => true,
            GgmlPath::Tiled => false,
            p => panic!("the Q4_K tile has no {p:?} path"),
        };
        let row = |i: usize| &rows[i * row_bytes..(i + 1) * row_bytes];
        let mut i = 0;
        while i + 2 <= n_rows {
            rows_q4_k::<2>([row(i), row(i + 1)], tile, gemm, outs, i);
            i += 2;
        }
        if i < n_rows {
            rows_q4_k::<1>([row(i)], tile, gemm, outs, i);
        }
    }

    /// [`dot_rows_q4_k`] for the `R` rows `w` (outputs `i ..`).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    #[allow(clippy::needless_range_loop)] // r indexes the rows' weights, scales and accumulators alike
    unsafe fn rows_q4_k<const R: usize>(
        w: [&[u8]; R],
        tile: &[Line],
        gemm: bool,
        outs: &mut [&mut [f32]; TOKENS],
        i: usize,
    ) {
        let mut u = [const { Unpacked([0; QK_K]) }; R];
        let mut acc = [_mm512_setzero_ps(); R];
        let mut accm = [_mm512_setzero_ps(); R];
        let nb = w[0].len() / q4_k::BYTES;
        for ib in 0..nb {
            let blk: [&[u8]; R] =
                std::array::from_fn(|r| &w[r][ib * q4_k::BYTES..(ib + 1) * q4_k::BYTES]);
            let mut dw = [0f32; R];
            let mut dminw = [0f32; R];
            let mut sc = [[0u8; 8]; R];
            let mut m = [[0u8; 8]; R];
            for r in 0..R {
                (dw[r], dminw[r]) = f16x2(blk[r].as_ptr());
                (sc[r], m[r]) = q4_k::scales_mins(&blk[r][4..16]);
                unpack_q4(blk[r], &mut u[r]);
            }
            let xt = tile.as_ptr().add(ib * LINES_PER_BLOCK);
            let dy = _mm512_load_ps(xt.add(D_LINE) as *const f32);
            if gemm {
                let dsc: [__m512; R] =
                    std::array::from_fn(|r| _mm512_mul_ps(_mm512_set1_ps(dw[r]), dy));
                let dmn: [__m512; R] =
                    std::array::from_fn(|r| _mm512_mul_ps(_mm512_set1_ps(dminw[r]), dy));
                for p in 0..4 {
                    let d0 = dot_lines(&u, xt, 16 * p, 8);
                    let d1 = dot_lines(&u, xt, 16 * p + 8, 8);
                    for r in 0..R {
                        // sc₀·D₀ + sc₁·D₁, exact (module docs)
                        let lo = _mm512_mul_ps(
                            _mm512_set1_ps(f32::from(sc[r][2 * p])),
                            _mm512_cvtepi32_ps(d0[r]),
                        );
                        let s = _mm512_fmadd_ps(
                            _mm512_set1_ps(f32::from(sc[r][2 * p + 1])),
                            _mm512_cvtepi32_ps(d1[r]),
                            lo,
                        );
                        acc[r] = _mm512_fmadd_ps(s, dsc[r], acc[r]);
                        let mn = _mm512_cvtepi32_ps(mins(xt, &m[r], p));
                        accm[r] = _mm512_fmadd_ps(mn, dmn[r], accm[r]);
                    }
                }
            } else {
                let mut s1 = [_mm512_setzero_si512(); R];
                for g in 0..8 {
                    let d = dot_lines(&u, xt, 8 * g, 8);
                    for r in 0..R {
                        let scv = _mm512_set1_epi32(i32::from(sc[r][g]));
                        s1[r] = _mm512_add_epi32(s1[r], _mm512_mullo_epi32(d[r], scv));
                    }
                }
                for r in 0..R {
                    let mut s2 = _mm512_setzero_si512();
                    for p in 0..4 {
                        s2 = _mm512_add_epi32(s2, mins(xt, &m[r], p));
                    }
                    let res = _mm512_fmadd_ps(
                        _mm512_set1_ps(-dminw[r]),
                        _mm512_cvtepi32_ps(s2),
                        _mm512_mul_ps(_mm512_set1_ps(dw[r]), _mm512_cvtepi32_ps(s1[r])),
                    );
                    acc[r] = _mm512_fmadd_ps(res, dy, acc[r]);
                }
            }
        }
        for r in 0..R {
            let out = if gemm {
                _mm512_sub_ps(acc[r], accm[r])
            } else {
                acc[r]
            };
            store(out, outs, i + r);
        }
    }

    /// The 256 unsigned 6-bit quants of the Q6_K super-block `blk` into `w` (element order, as
    /// `avx2::dot_q6_k_q8_k` unpacks them: `ql` low/high nibbles and two bits of `qh` each).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn unpack_q6(blk: &[u8], w: &mut Unpacked) {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        let p = blk.as_ptr();
        let out = w.0.as_mut_ptr() as *mut __m256i;
        for half in 0..2 {
            let ql0 = _mm256_loadu_si256(p.add(64 * half) as *const __m256i);
            let ql1 = _mm256_loadu_si256(p.add(64 * half + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * half) as *const __m256i);
            let hi0 = _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4);
            let hi2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4);
            let hi4 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4);
            let hi6 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4);
            let lo0 = _mm256_and_si256(ql0, m4);
            let lo1 = _mm256_and_si256(ql1, m4);
            let up0 = _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4);
            let up1 = _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4);
            _mm256_store_si256(out.add(4 * half), _mm256_or_si256(lo0, hi0));
            _mm256_store_si256(out.add(4 * half + 1), _mm256_or_si256(lo1, hi2));
            _mm256_store_si256(out.add(4 * half + 2), _mm256_or_si256(up0, hi4));
            _mm256_store_si256(out.add(4 * half + 3), _mm256_or_si256(up1, hi6));
        }
    }

    /// `outs[t][i]` = the Q6_K output of weight row `i < n_rows` and token `t` of `tile` on the tiled
    /// path: the bits of `q6_k::dot_q8_k_tiled` (module docs). The quants are unsigned (`q + 32`), so
    /// `s1 = Σ_k sc_k·D_k − 32·Σ_k sc_k·bsum_k`, the integer of the spec. Two rows per step, as
    /// [`dot_rows_q4_k`].
    ///
    /// # Safety
    /// As [`dot_rows_q4_k`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn dot_rows_q6_k(
        rows: &[u8],
        row_bytes: usize,
        n_rows: usize,
        tile: &[Line],
        outs: &mut [&mut [f32]; TOKENS],
    ) {
        check(rows, row_bytes, n_rows, q6_k::BYTES, tile, outs);
        let row = |i: usize| &rows[i * row_bytes..(i + 1) * row_bytes];
        let mut i = 0;
        while i + 2 <= n_rows {
            rows_q6_k::<2>([row(i), row(i + 1)], tile, outs, i);
            i += 2;
        }
        if i < n_rows {
            rows_q6_k::<1>([row(i)], tile, outs, i);
        }
    }

    /// [`dot_rows_q6_k`] for the `R` rows `w` (outputs `i ..`).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    #[allow(clippy::needless_range_loop)] // r indexes the rows' weights, scales and accumulators alike
    unsafe fn rows_q6_k<const R: usize>(
        w: [&[u8]; R],
        tile: &[Line],
        outs: &mut [&mut [f32]; TOKENS],
        i: usize,
    ) {
        let mut u = [const { Unpacked([0; QK_K]) }; R];
        let mut acc = [_mm512_setzero_ps(); R];
        let nb = w[0].len() / q6_k::BYTES;
        for ib in 0..nb {
            let blk: [&[u8]; R] =
                std::array::from_fn(|r| &w[r][ib * q6_k::BYTES..(ib + 1) * q6_k::BYTES]);
            let mut dw = [0f32; R];
            let mut sc = [[0i16; 16]; R];
            for r in 0..R {
                dw[r] = f16x1(blk[r].as_ptr().add(208));
                for (k, s) in sc[r].iter_mut().enumerate() {
                    *s = i16::from(blk[r][192 + k] as i8);
                }
                unpack_q6(blk[r], &mut u[r]);
            }
            let xt = tile.as_ptr().add(ib * LINES_PER_BLOCK);
            let dy = _mm512_load_ps(xt.add(D_LINE) as *const f32);
            let mut s = [_mm512_setzero_si512(); R];
            for k in 0..16 {
                let d = dot_lines(&u, xt, 4 * k, 4);
                for r in 0..R {
                    let scv = _mm512_set1_epi32(sc[r][k].into());
                    s[r] = _mm512_add_epi32(s[r], _mm512_mullo_epi32(d[r], scv));
                }
            }
            for r in 0..R {
                let mut off = _mm512_setzero_si512();
                for l in 0..8 {
                    let bs = _mm512_load_si512(xt.add(PAIR_LINE + l) as *const _);
                    let scp = _mm512_set1_epi32(pair(sc[r][2 * l], sc[r][2 * l + 1]));
                    off = _mm512_add_epi32(off, _mm512_madd_epi16(bs, scp));
                }
                let s1 = _mm512_sub_epi32(s[r], _mm512_slli_epi32(off, 5));
                let res = _mm512_mul_ps(_mm512_set1_ps(dw[r]), _mm512_cvtepi32_ps(s1));
                acc[r] = _mm512_fmadd_ps(res, dy, acc[r]);
            }
        }
        for (r, &a) in acc.iter().enumerate() {
            store(a, outs, i + r);
        }
    }
}

#[cfg(test)]
mod tests;
