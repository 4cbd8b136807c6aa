//! F16 weights in ggml mode, prefill, AVX-512: llamafile's `tinyBLAS<16, __m512, __m512, ggml_fp16_t,
//! ggml_fp16_t, float>` (ggml-cpu/llamafile/sgemm.cpp, `gemm_bloc`) with its own technique — both
//! operands read as f16 and widened inside the register tile (`load<__m512>(const ggml_fp16_t *)` =
//! `_mm512_cvtph_ps`), four weight rows × six tokens per tile (its `mnpack<4, 6, BM>` on a CPU with 32
//! vector registers).
//!
//! Every output is one 16-lane accumulator, `acc = fma(w[k..k+16], x[k..k+16], acc)` over chunks of 16
//! elements in increasing `k`, then `hsum` = `_mm512_reduce_add_ps` (sixteen outputs at a time: `x86::reduce_tile_512`). Widening
//! f16 to f32 is exact, so this is the 16-lane order of `reference_fma.rs` on the widened rows, and the
//! tile shape, the token blocking and the thread split change no output's bits (the tests compare with
//! `reference_fma::dot_scalar`). The activation is the row rounded to f16 by ggml mode's `prepare`
//! (`ggml_cpu_fp32_to_fp16`), read from its f16 bytes (`PreparedRow::blocks`); the weights from the
//! memory map, with no f32 copy of either.

use std::arch::x86_64::*;

use super::x86::reduce_tile_512 as reduce_tile;

/// True if this CPU has the instructions of these kernels (AVX-512 F: `vcvtph2ps` on 512 bits and the
/// 32 vector registers the 4 × 6 tile needs).
pub(crate) fn available() -> bool {
    crate::numerics::cpu_has("avx512f")
}

/// Tokens per tile (tinyBLAS's `RN` with 32 vector registers).
const TOKENS: usize = 6;
/// Weight rows per tile (tinyBLAS's `RM`).
const ROWS: usize = 4;

/// Sixteen f16 values at `p` (unaligned), widened to f32 (exact).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// The outputs of `R` ≤ 4 weight rows × `T` ≤ 6 activation rows, f16 bytes, `n` elements each (a
/// multiple of 16).
///
/// # Safety
/// The CPU has AVX-512 F; every pointer reads `2·n` bytes.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<const R: usize, const T: usize>(
    ws: [*const u8; R],
    xs: [*const u8; T],
    n: usize,
) -> [[f32; T]; R] {
    let acc = accumulate::<R, T>(ws, xs, n);
    let sums = reduce_tile(&acc);
    std::array::from_fn(|r| std::array::from_fn(|t| sums[r][t]))
}

/// The 16-lane accumulators of [`tile`] (rows ≥ `R` or tokens ≥ `T` left zero). Kept out of line:
/// inlined next to the reductions, LLVM's register allocation of the loop spilled again.
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx512f")]
#[inline(never)]
unsafe fn accumulate<const R: usize, const T: usize>(
    ws: [*const u8; R],
    xs: [*const u8; T],
    n: usize,
) -> [[__m512; TOKENS]; ROWS] {
    const { assert!(R >= 1 && R <= ROWS && T >= 1 && T <= TOKENS) };
    let z = _mm512_setzero_ps();
    let (mut c00, mut c01, mut c02, mut c03, mut c04, mut c05) = (z, z, z, z, z, z);
    let (mut c10, mut c11, mut c12, mut c13, mut c14, mut c15) = (z, z, z, z, z, z);
    let (mut c20, mut c21, mut c22, mut c23, mut c24, mut c25) = (z, z, z, z, z, z);
    let (mut c30, mut c31, mut c32, mut c33, mut c34, mut c35) = (z, z, z, z, z, z);
    let mut k = 0;
    while k < n {
        // weight row `r`'s sixteen values (zero for a row the tile does not have)
        macro_rules! weight {
            ($r:literal) => {
                if R > $r {
                    load16(ws[$r % R].add(2 * k))
                } else {
                    z
                }
            };
        }
        let (w0, w1, w2, w3) = (weight!(0), weight!(1), weight!(2), weight!(3));
        // token `t`'s sixteen values into the accumulators of rows 0..R
        macro_rules! token {
            ($t:literal: $c0:ident $c1:ident $c2:ident $c3:ident) => {
                if T > $t {
                    let x = load16(xs[$t % T].add(2 * k));
                    $c0 = _mm512_fmadd_ps(w0, x, $c0);
                    if R > 1 {
                        $c1 = _mm512_fmadd_ps(w1, x, $c1);
                    }
                    if R > 2 {
                        $c2 = _mm512_fmadd_ps(w2, x, $c2);
                    }
                    if R > 3 {
                        $c3 = _mm512_fmadd_ps(w3, x, $c3);
                    }
                }
            };
        }
        token!(0: c00 c10 c20 c30);
        token!(1: c01 c11 c21 c31);
        token!(2: c02 c12 c22 c32);
        token!(3: c03 c13 c23 c33);
        token!(4: c04 c14 c24 c34);
        token!(5: c05 c15 c25 c35);
        k += 16;
    }
    // named variables in the loop, not an array: LLVM kept an array of them on the stack (a load and a
    // store per fma), which halved the speed
    [
        [c00, c01, c02, c03, c04, c05],
        [c10, c11, c12, c13, c14, c15],
        [c20, c21, c22, c23, c24, c25],
        [c30, c31, c32, c33, c34, c35],
    ]
}

/// Every row of one block of `T` tokens: tiles of [`ROWS`] rows, then the remaining rows one by one.
///
/// # Safety
/// As [`matmul`].
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn token_block<const T: usize>(
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    xs: &[&[u8]],
    t0: usize,
    put: &mut impl FnMut(usize, usize, f32),
) {
    let n = row_bytes / 2;
    let row = |r: usize| rows.as_ptr().add(r * row_bytes);
    let xp: [*const u8; T] = std::array::from_fn(|j| xs[t0 + j].as_ptr());
    let mut r = 0;
    while r + ROWS <= n_rows {
        let o = tile::<ROWS, T>(std::array::from_fn(|i| row(r + i)), xp, n);
        for (i, ov) in o.iter().enumerate() {
            for (j, &v) in ov.iter().enumerate() {
                put(r + i, t0 + j, v);
            }
        }
        r += ROWS;
    }
    for r in r..n_rows {
        let o = tile::<1, T>([row(r)], xp, n);
        for (j, &v) in o[0].iter().enumerate() {
            put(r, t0 + j, v);
        }
    }
}

/// `put(i, t, ·)`: the tinyBLAS output of F16 weight row `i` (of `n_rows` rows of `row_bytes` bytes in
/// `rows`) and activation row `xs[t]` (f16 bytes, `row_bytes` long), for every `i` and `t`. Blocks of six
/// tokens outermost (their 6 · `row_bytes` bytes stay in L1 while the rows stream through from L2, so the
/// caller should pass a few hundred KiB of rows at a time), the last block narrower.
///
/// # Safety
/// The CPU has AVX-512 F ([`available`]).
///
/// # Panics
/// If `row_bytes` is not a multiple of 32 (16 elements: tinyBLAS's `KN`), `rows` is shorter than
/// `n_rows` rows, or an activation row is shorter than `row_bytes`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn matmul(
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    xs: &[&[u8]],
    mut put: impl FnMut(usize, usize, f32),
) {
    assert!(
        row_bytes.is_multiple_of(32),
        "F16 rows of {row_bytes} bytes"
    );
    assert!(rows.len() >= n_rows * row_bytes, "F16 weight rows");
    assert!(
        xs.iter().all(|x| x.len() >= row_bytes),
        "F16 activation rows"
    );
    let p = &mut put;
    let full = xs.len() - xs.len() % TOKENS;
    for t0 in (0..full).step_by(TOKENS) {
        token_block::<TOKENS>(rows, row_bytes, n_rows, xs, t0, p);
    }
    match xs.len() - full {
        0 => {}
        1 => token_block::<1>(rows, row_bytes, n_rows, xs, full, p),
        2 => token_block::<2>(rows, row_bytes, n_rows, xs, full, p),
        3 => token_block::<3>(rows, row_bytes, n_rows, xs, full, p),
        4 => token_block::<4>(rows, row_bytes, n_rows, xs, full, p),
        _ => token_block::<5>(rows, row_bytes, n_rows, xs, full, p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fp::{f16_to_f32, f32_to_f16_cpu};
    use crate::quant::reference_fma::dot_scalar;
    use crate::quant::test_rng::Rng;

    /// f16 bytes of `v`, and the same values widened.
    fn halves(v: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let b: Vec<u8> = v
            .iter()
            .flat_map(|&x| f32_to_f16_cpu(x).to_le_bytes())
            .collect();
        let w = b
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        (b, w)
    }

    /// Every output equals the 16-lane order on the widened rows (`dot_scalar`), bit for bit, for token
    /// counts around the six-token block and row counts around the four-row tile, on values spanning
    /// f16's range with subnormals, ±0, ±inf and NaN among them.
    #[test]
    fn tiles_give_the_sixteen_lane_bits_for_every_shape() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 F");
            return;
        }
        let mut rng = Rng(0x51f1_6a11_7e5e_0001);
        let special = [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            6.0e-8,
            -3.0e-5,
        ];
        for cols in [16usize, 48, 576] {
            for n_rows in [1usize, 3, 4, 5, 9] {
                for n_tok in [1usize, 2, 5, 6, 7, 12, 13] {
                    let mut draw = |i: usize| {
                        let r = rng.next();
                        if r.is_multiple_of(97) {
                            special[(r >> 8) as usize % special.len()]
                        } else {
                            ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * (1 << (i % 11)) as f32
                        }
                    };
                    let (wb, wf) = halves(&(0..n_rows * cols).map(&mut draw).collect::<Vec<_>>());
                    let xs: Vec<(Vec<u8>, Vec<f32>)> = (0..n_tok)
                        .map(|_| halves(&(0..cols).map(&mut draw).collect::<Vec<_>>()))
                        .collect();
                    let xb: Vec<&[u8]> = xs.iter().map(|x| &x.0[..]).collect();
                    let mut got = vec![None; n_rows * n_tok];
                    // SAFETY: AVX-512 F checked above; the slices hold whole rows.
                    unsafe {
                        matmul(&wb, 2 * cols, n_rows, &xb, |r, t, v| {
                            assert!(got[r * n_tok + t].replace(v).is_none(), "({r}, {t}) twice");
                        })
                    };
                    for r in 0..n_rows {
                        for t in 0..n_tok {
                            let want = dot_scalar(&wf[r * cols..(r + 1) * cols], &xs[t].1);
                            let g = got[r * n_tok + t].expect("every output written");
                            assert!(
                                g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                                "cols {cols} rows {n_rows} tokens {n_tok} ({r}, {t}): {g:e} vs {want:e}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A row whose length is not a multiple of tinyBLAS's 16 elements is refused (tinyBLAS does not run
    /// there: `float::tinyblas_applies`).
    #[test]
    #[should_panic(expected = "F16 rows of 40 bytes")]
    fn a_row_of_twenty_elements_is_refused() {
        if !available() {
            panic!("F16 rows of 40 bytes (skipped: no AVX-512 F)");
        }
        let w = vec![0u8; 40];
        // SAFETY: AVX-512 F checked above.
        unsafe { matmul(&w, 40, 1, &[&w[..]], |_, _, _| {}) };
    }
}
