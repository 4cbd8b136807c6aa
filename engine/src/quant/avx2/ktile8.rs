//! AVX2 tiles of the K-quant prefill (Q4_K, Q6_K): eight prompt tokens in the eight lanes of one 256-bit
//! vector, for [`crate::numerics::Simd::Avx2`] (and the groups of eight that the AVX-512 kernels hand to
//! their AVX2 names).
//!
//! llama.cpp's AVX2 build runs Q4_K weights through its repacked gemm (`ggml_gemm_q4_K_8x8_q8_K`,
//! ggml-cpu/arch/x86/repack.cpp, `__AVX2__` branch: eight interleaved weight rows × four tokens, the
//! integer sums of a pair of sub-blocks kept in i32 lanes and one fma per pair) and Q6_K (and Q4_K rows
//! that were not repacked) through the tiled K-quant matmul (ggml-cpu/tiled, `tiled_run_microtile_avx2`).
//! Both round only in a few f32 operations per super-block and output; everything before is exact
//! integers (`q4_k::dot_q8_k_repacked` / `dot_q8_k_tiled`, `q6_k::dot_q8_k_tiled` spell them out). The
//! row-at-a-time kernels of [`super`] (`dot_q4_k_q8_k`, `dot_q6_k_q8_k`) get those integers per token
//! with one horizontal sum each and run the f32 steps in scalar code; these tiles run one weight row
//! against eight tokens and amortise both:
//!
//! - **Weights unpacked once per row and super-block** for all eight tokens (Q4_K nibbles, Q6_K 6-bit
//!   codes), `maddubs` with each token's Q8_K quants and `madd` with the sub-block scales (exact: no i16
//!   pair saturates, |code| ≤ 63, |q8| ≤ 128).
//! - **One transposing reduction for eight tokens** ([`super::hsum_i32_8x8`]): the eight tokens' i32 lane
//!   vectors of a pair of sub-blocks (Q4_K gemm) or of the whole super-block (tiled) become one vector
//!   whose lane `t` is token `t`'s sum, instead of eight `hsum_i32_8`.
//! - **Q4_K's mins for eight tokens in one `madd`**: the tokens' sub-block sums of the Q8_K `bsums`,
//!   `(B[2p], B[2p+1])` as i16 pairs token by token ([`Tile8`], made once per call for all rows), times
//!   `(m[2p], m[2p+1])` give `imin_p` of every token. Q6_K's `32·Σ sc·bsums` is one `madd` per token.
//! - **The f32 steps lane by lane**, each lane the scalar spec's chain for its token: Q4_K gemm
//!   `acc = fma(isum_p, d_w·d_x, acc)`, `accm = fma(imin_p, dmin_w·d_x, accm)` per pair `p` in order,
//!   result `acc − accm`; Q4_K tiled `res = fma(−dmin_w, s2, d_w·s1)`, `acc = fma(res, d_x, acc)`; Q6_K
//!   tiled `acc = fma(d_w·s1, d_x, acc)`. Same operations on the same values, so the same bits.
//!
//! The kernels are `unsafe`: the CPU must have AVX2, FMA and F16C (a [`super::super::SimdKernel`]
//! exists only then); shapes are checked with `assert!`.

use std::arch::x86_64::*;

use super::super::q8_k::QK_K;
use super::super::{q4_k, q6_k, GgmlPath};
use super::{f16x1, f16x2, hsum_i32_8x8, Q8kRow};

/// Tokens per tile: the lanes of one 256-bit vector.
pub(crate) const TOKENS: usize = 8;

/// 32-bit words per super-block in a [`Tile8`]: the tokens' `d` (f32 bits), then four lines of Q4_K
/// bsum pairs.
const WORDS_PER_BLOCK: usize = 5 * TOKENS;

/// The per-token numbers of eight Q8_K activation rows that the tiles read as vectors, transposed once
/// per call for every weight row: per super-block `ib`, words `40·ib .. 40·ib + 8` hold the tokens' `d`
/// (f32 bits, token `t` in word `t`), and line `p < 4` (words `40·ib + 8·(p+1) ..`) token `t`'s
/// `(B[2p], B[2p+1])` as the low and high i16 of word `t`, `B[g] = bsums[2g] + bsums[2g+1]` (the sum of
/// sub-block `g`'s 32 quants; |B| ≤ 32·128, an exact i16).
pub(crate) struct Tile8<'a>(&'a [u32]);

impl<'a> Tile8<'a> {
    /// The tile of the activation rows `x` (each `nb` super-blocks, checked) in `buf` (resized).
    pub(crate) fn build(x: &[Q8kRow<'_>; TOKENS], nb: usize, buf: &'a mut Vec<u32>) -> Self {
        for r in x {
            assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * QK_K / 16);
        }
        buf.clear();
        buf.resize(nb * WORDS_PER_BLOCK, 0);
        for (ib, words) in buf.chunks_exact_mut(WORDS_PER_BLOCK).enumerate() {
            for (t, r) in x.iter().enumerate() {
                words[t] = r.d[ib].to_bits();
                let bs = &r.bsums[ib * QK_K / 16..(ib + 1) * QK_K / 16];
                for p in 0..4 {
                    let lo = bs[4 * p].wrapping_add(bs[4 * p + 1]);
                    let hi = bs[4 * p + 2].wrapping_add(bs[4 * p + 3]);
                    words[TOKENS * (p + 1) + t] =
                        u32::from(lo as u16) | (u32::from(hi as u16) << 16);
                }
            }
        }
        Tile8(buf)
    }

    /// Super-blocks per activation row.
    fn blocks(&self) -> usize {
        self.0.len() / WORDS_PER_BLOCK
    }
}

thread_local! {
    /// Per-thread buffer of the [`Tile8`] that [`dot_rows_q4_k`] makes per call (grows once, then reused).
    static TILE8: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// True if the tiles compute a call of eight activation rows whose paths are `paths` (already
/// `effective_path`'d): Q4_K with every row on the repacked gemm or every row on the tiled path, Q6_K
/// with every row on the tiled path.
pub(crate) fn handles_q4_k(paths: &[GgmlPath]) -> bool {
    paths.len() == TOKENS
        && (paths.iter().all(|&p| p == GgmlPath::RepackGemm)
            || paths.iter().all(|&p| p == GgmlPath::Tiled))
}

/// See [`handles_q4_k`].
pub(crate) fn handles_q6_k(paths: &[GgmlPath]) -> bool {
    paths.len() == TOKENS && paths.iter().all(|&p| p == GgmlPath::Tiled)
}

/// Check the shapes shared by both kernels; returns the number of super-blocks per row.
fn check(
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    block_bytes: usize,
    x: &[Q8kRow<'_>; TOKENS],
    outs: &[&mut [f32]; TOKENS],
) -> usize {
    let nb = row_bytes / block_bytes;
    assert_eq!(row_bytes, nb * block_bytes, "whole super-blocks per row");
    assert!(rows.len() >= n_rows * row_bytes);
    for r in x {
        assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * QK_K / 16);
    }
    assert!(outs.iter().all(|o| o.len() >= n_rows));
    nb
}

/// Lane `t` of `v` into `outs[t][i]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn store(v: __m256, outs: &mut [&mut [f32]; TOKENS], i: usize) {
    let mut o = [0f32; TOKENS];
    _mm256_storeu_ps(o.as_mut_ptr(), v);
    for (out, o) in outs.iter_mut().zip(o) {
        // SAFETY: every output holds `n_rows > i` floats (`check`)
        *out.get_unchecked_mut(i) = o;
    }
}

/// `outs[t][i]` = the Q4_K output of weight row `i < n_rows` (rows of `row_bytes` bytes in `rows`) and
/// activation row `x[t]` on `path` (`RepackGemm` or `Tiled`): the bits of
/// `q4_k::dot_q8_k_repacked(.., gemm = true)` resp. `q4_k::dot_q8_k_tiled` (module docs). Mirrors
/// `ggml_gemm_q4_K_8x8_q8_K` (arch/x86/repack.cpp, AVX2) resp. `tiled_run_microtile_avx2`
/// (ggml-cpu/tiled) per output.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C. Shapes are checked; `path` must be one of the two (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_rows_q4_k(
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    x: [Q8kRow<'_>; TOKENS],
    path: GgmlPath,
    outs: &mut [&mut [f32]; TOKENS],
) {
    let nb = check(rows, row_bytes, n_rows, q4_k::BYTES, &x, outs);
    let gemm = match path {
        GgmlPath::RepackGemm => true,
        GgmlPath::Tiled => false,
        p => panic!("the AVX2 Q4_K tile has no {p:?} path"),
    };
    // the thread's buffer taken out for the call (the row loop stays in this function, compiled with
    // the kernels' features) and put back after it
    let mut buf = TILE8.with(|b| b.take());
    let tile = Tile8::build(&x, nb, &mut buf);
    for i in 0..n_rows {
        let w = &rows[i * row_bytes..(i + 1) * row_bytes];
        let r = if gemm {
            row_q4_k::<true>(w, &x, &tile)
        } else {
            row_q4_k::<false>(w, &x, &tile)
        };
        store(r, outs, i);
    }
    TILE8.with(|b| b.replace(buf));
}

/// `(lo, hi)` as the i16 pair of every i32 lane (`madd`'s operand).
#[inline]
fn pair(lo: u8, hi: u8) -> i32 {
    (i32::from(hi) << 16) | i32::from(lo)
}

/// One Q4_K weight row `w` against the eight tokens `x` (their [`Tile8`] `tile`): lane `t` = the output of
/// token `t`, gemm (`GEMM`) or tiled.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn row_q4_k<const GEMM: bool>(
    w: &[u8],
    x: &[Q8kRow<'_>; TOKENS],
    tile: &Tile8<'_>,
) -> __m256 {
    let nb = tile.blocks();
    debug_assert_eq!(w.len(), nb * q4_k::BYTES);
    let m4 = _mm256_set1_epi8(0x0F);
    let qy: [*const i8; TOKENS] = std::array::from_fn(|t| x[t].qs.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    for ib in 0..nb {
        let blk = w.as_ptr().add(ib * q4_k::BYTES);
        let (dw, dminw) = f16x2(blk);
        let (sc, m) = q4_k::scales_mins(std::slice::from_raw_parts(blk.add(4), 12));
        let words = tile.0.as_ptr().add(ib * WORDS_PER_BLOCK);
        let dy = _mm256_loadu_ps(words as *const f32);
        let (dsc, dmn) = (
            _mm256_mul_ps(_mm256_set1_ps(dw), dy),
            _mm256_mul_ps(_mm256_set1_ps(dminw), dy),
        );
        // tiled: the super-block's integer lanes of every token, summed over the four pairs
        let mut all = [_mm256_setzero_si256(); TOKENS];
        let mut s2 = _mm256_setzero_si256();
        for p in 0..4 {
            // run p of 32 bytes: sub-block 2p in the low nibbles, 2p+1 in the high ones
            let q = _mm256_loadu_si256(blk.add(16 + 32 * p) as *const __m256i);
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let (sl, sh) = (
                _mm256_set1_epi16(i16::from(sc[2 * p])),
                _mm256_set1_epi16(i16::from(sc[2 * p + 1])),
            );
            let mut v = [_mm256_setzero_si256(); TOKENS];
            for t in 0..TOKENS {
                let y = qy[t].add(ib * QK_K + 64 * p);
                let yl = _mm256_loadu_si256(y as *const __m256i);
                let yh = _mm256_loadu_si256(y.add(32) as *const __m256i);
                let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, yl), sl);
                let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yh), sh);
                v[t] = _mm256_add_epi32(pl, ph);
            }
            let bpair = _mm256_loadu_si256(words.add(TOKENS * (p + 1)) as *const __m256i);
            let imin = _mm256_madd_epi16(bpair, _mm256_set1_epi32(pair(m[2 * p], m[2 * p + 1])));
            if GEMM {
                let isum = _mm256_cvtepi32_ps(hsum_i32_8x8(&v));
                acc = _mm256_fmadd_ps(isum, dsc, acc);
                accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), dmn, accm);
            } else {
                for t in 0..TOKENS {
                    all[t] = _mm256_add_epi32(all[t], v[t]);
                }
                s2 = _mm256_add_epi32(s2, imin);
            }
        }
        if !GEMM {
            let s1 = _mm256_cvtepi32_ps(hsum_i32_8x8(&all));
            let res = _mm256_fmadd_ps(
                _mm256_set1_ps(-dminw),
                _mm256_cvtepi32_ps(s2),
                _mm256_mul_ps(_mm256_set1_ps(dw), s1),
            );
            acc = _mm256_fmadd_ps(res, dy, acc);
        }
    }
    if GEMM {
        _mm256_sub_ps(acc, accm)
    } else {
        acc
    }
}

/// `outs[t][i]` = the Q6_K output of weight row `i < n_rows` and activation row `x[t]` on the tiled path:
/// the bits of `q6_k::dot_q8_k_tiled` (module docs); mirrors `tiled_run_microtile_avx2` (ggml-cpu/tiled)
/// per output.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C. Shapes are checked.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_rows_q6_k(
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    x: [Q8kRow<'_>; TOKENS],
    outs: &mut [&mut [f32]; TOKENS],
) {
    let nb = check(rows, row_bytes, n_rows, q6_k::BYTES, &x, outs);
    let dy: Vec<__m256> = (0..nb)
        .map(|ib| {
            let d: [f32; TOKENS] = std::array::from_fn(|t| x[t].d[ib]);
            _mm256_loadu_ps(d.as_ptr())
        })
        .collect();
    for i in 0..n_rows {
        let w = &rows[i * row_bytes..(i + 1) * row_bytes];
        store(row_q6_k(w, &x, &dy), outs, i);
    }
}

/// One Q6_K weight row `w` against the eight tokens `x` (`dy[ib]`: their `d` of super-block `ib`): lane
/// `t` = the tiled output of token `t`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn row_q6_k(w: &[u8], x: &[Q8kRow<'_>; TOKENS], dy: &[__m256]) -> __m256 {
    let nb = dy.len();
    debug_assert_eq!(w.len(), nb * q6_k::BYTES);
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x03);
    let qy: [*const i8; TOKENS] = std::array::from_fn(|t| x[t].qs.as_ptr());
    let bs: [*const i16; TOKENS] = std::array::from_fn(|t| x[t].bsums.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for (ib, &dy) in dy.iter().enumerate() {
        let p = w.as_ptr().add(ib * q6_k::BYTES);
        let dw = f16x1(p.add(208));
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192) as *const __m128i));
        // token t's 32·Σ_j sc[j]·bsums[j], lane by lane (the vec_dot kernel's offsets)
        let mut lanes: [__m256i; TOKENS] = std::array::from_fn(|t| {
            let b = _mm256_loadu_si256(bs[t].add(ib * QK_K / 16) as *const __m256i);
            _mm256_sub_epi32(
                _mm256_setzero_si256(),
                _mm256_slli_epi32(_mm256_madd_epi16(b, sc16), 5),
            )
        });
        for half in 0..2 {
            let ql0 = _mm256_loadu_si256(p.add(64 * half) as *const __m256i);
            let ql1 = _mm256_loadu_si256(p.add(64 * half + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * half) as *const __m256i);
            for k in 0..4 {
                // group g = 4·half + k: 32 quants, sub-blocks 2g and 2g+1
                let g = 4 * half + k;
                let low = match k {
                    0 => _mm256_and_si256(ql0, m4),
                    1 => _mm256_and_si256(ql1, m4),
                    2 => _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _ => _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                };
                let h = match k {
                    0 => qh,
                    1 => _mm256_srli_epi16(qh, 2),
                    2 => _mm256_srli_epi16(qh, 4),
                    _ => _mm256_srli_epi16(qh, 6),
                };
                let q6 = _mm256_or_si256(low, _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
                let scv = _mm256_set_m128i(
                    _mm_set1_epi16(i16::from(*p.add(192 + 2 * g + 1) as i8)),
                    _mm_set1_epi16(i16::from(*p.add(192 + 2 * g) as i8)),
                );
                for t in 0..TOKENS {
                    let y = _mm256_loadu_si256(qy[t].add(ib * QK_K + 32 * g) as *const __m256i);
                    let d = _mm256_madd_epi16(_mm256_maddubs_epi16(q6, y), scv);
                    lanes[t] = _mm256_add_epi32(lanes[t], d);
                }
            }
        }
        let s1 = _mm256_cvtepi32_ps(hsum_i32_8x8(&lanes));
        acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dw), s1), dy, acc);
    }
    acc
}

#[cfg(test)]
mod tests;
