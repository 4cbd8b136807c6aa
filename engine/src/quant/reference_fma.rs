//! Reference mode with SIMD on: f32 dot products of dequantized weight rows in one fixed 16-lane FMA
//! order, computed several outputs at a time (register tiles of weight rows × activation rows).
//!
//! Order of every output `Σ_k w[k] · x[k]` (fixed, the same for every tile shape, batch size, chunking and
//! thread count, and the same bits from the AVX-512 kernels, the AVX2 kernels and the scalar mirror
//! [`dot_scalar`]):
//!
//! 1. sixteen lanes start at +0.0; element `k` goes into lane `k % 16` as `lane = fma(w[k], x[k], lane)`
//!    (one rounding), elements in increasing `k`;
//! 2. the lanes are combined as `_mm512_reduce_add_ps` ([`reduce_add_16`]: `t[i] = l[8 + i] + l[i]`, then
//!    `t[4 + i] + t[i]`, then `hsum_float_4`).
//!
//! The AVX-512 kernels hold the 16 lanes in one `__m512`; the AVX2 kernels in two `__m256` (lanes 0..8
//! and 8..16) — every lane sees the same fmas in the same order, so the bits do not depend on the register
//! width. A row length that is not a multiple of 16 ends with scalar fmas into the stored lanes.
//!
//! With SIMD off, reference mode keeps the portable order of `reference.rs` (8 lanes, rounded products
//! then adds): a session's reference-mode bits depend on whether SIMD is on, not on which SIMD setting.

use super::x86::{fma, reduce_add_16};
use crate::numerics::Simd;

/// Which kernels compute the 16-lane order (all give the same bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lanes16 {
    /// `__m512` registers (AVX-512 F; 32 registers, larger tiles).
    Avx512,
    /// Two `__m256` per accumulator (AVX2 + FMA).
    Avx2,
    /// [`dot_scalar`] (a CPU without FMA; only reachable if a caller asks for SIMD the CPU lacks).
    Scalar,
}

impl Lanes16 {
    /// The kernels for a session's SIMD setting on this CPU: `avx512` where the CPU has AVX-512 F,
    /// `avx2` (and `avx512` without it) where it has AVX2 + FMA, the scalar mirror otherwise.
    pub(crate) fn for_simd(simd: Simd) -> Lanes16 {
        #[cfg(target_arch = "x86_64")]
        {
            if simd == Simd::Avx512 && crate::numerics::cpu_has("avx512f") {
                return Lanes16::Avx512;
            }
            if simd != Simd::Off && crate::numerics::avx2_available() {
                return Lanes16::Avx2;
            }
        }
        let _ = simd;
        Lanes16::Scalar
    }

    /// The best kernels this CPU has ([`Lanes16::for_simd`] of [`Simd::detect`]).
    pub(crate) fn detect() -> Lanes16 {
        Lanes16::for_simd(Simd::detect())
    }
}

/// One output in the 16-lane order, scalar: the specification the SIMD kernels match bit for bit.
/// `w.len() == x.len()` (the caller's contract; the shorter length is used).
pub(crate) fn dot_scalar(w: &[f32], x: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for (k, (&a, &b)) in w.iter().zip(x).enumerate() {
        lanes[k % 16] = fma(a, b, lanes[k % 16]);
    }
    reduce_add_16(&lanes)
}

/// One output in the 16-lane order with the kernels of `kind`.
pub(crate) fn dot(kind: Lanes16, w: &[f32], x: &[f32]) -> f32 {
    let mut out = [0f32; 1];
    matmul(kind, w, x.len().min(w.len()), &[x], |_, _, v| out[0] = v);
    out[0]
}

/// Every product of the weight rows in `w` (`n_rows = w.len() / cols` rows of `cols` f32, row-major)
/// with the activation rows `xs` (each `cols` long): `put(r, t, Σ_k w[r·cols + k] · xs[t][k])`, each in
/// the module's 16-lane order. Tiles: AVX-512 2 rows × 8 tokens, AVX2 2 × 2; fewer tokens than that
/// (decode) and the remainders 4 rows × 1 token, then 1 × 1 — every tile in the same order.
///
/// # Panics
/// If an activation row is shorter than `cols` or `w` is not a whole number of rows.
pub(crate) fn matmul(
    kind: Lanes16,
    w: &[f32],
    cols: usize,
    xs: &[&[f32]],
    mut put: impl FnMut(usize, usize, f32),
) {
    assert!(
        cols > 0 && w.len().is_multiple_of(cols),
        "weight rows of {cols}"
    );
    assert!(
        xs.iter().all(|x| x.len() >= cols),
        "activation rows of {cols}"
    );
    let n_rows = w.len() / cols;
    match kind {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Lanes16::Avx512` is only made where the CPU has AVX-512 F (`for_simd`); the lengths
        // are checked above.
        Lanes16::Avx512 => unsafe { x86::matmul_avx512(w, cols, n_rows, xs, &mut put) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Lanes16::Avx2` is only made where the CPU has AVX2 and FMA (`for_simd`).
        Lanes16::Avx2 => unsafe { x86::matmul_avx2(w, cols, n_rows, xs, &mut put) },
        _ => {
            for r in 0..n_rows {
                for (t, x) in xs.iter().enumerate() {
                    put(r, t, dot_scalar(&w[r * cols..(r + 1) * cols], &x[..cols]));
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::x86::{fma, reduce_add_16, reduce_add_16_halves, reduce_tile_512};

    /// Declares a tile kernel and the matmul that walks a weight block with it, for one register kind.
    macro_rules! kernels {
        (
            $feat:literal, $tile:ident, $matmul:ident, $v:ty,
            zero: $zero:expr, load: $load:ident, fma: $fmav:ident, store: $store:ident,
            reduce: $reduce:ident, big: ($br:literal, $bt:literal), one: $or:literal
        ) => {
            /// `R` weight rows × `T` activation rows over `n` elements, each output in the 16-lane order.
            ///
            /// # Safety
            /// The CPU has the function's features; every pointer reads `n` f32.
            #[target_feature(enable = $feat)]
            unsafe fn $tile<const R: usize, const T: usize>(
                ws: [*const f32; R],
                xs: [*const f32; T],
                n: usize,
            ) -> [[f32; T]; R] {
                let mut acc: [[$v; T]; R] = [[$zero; T]; R];
                let full = n - n % 16;
                let mut k = 0;
                while k < full {
                    let wv: [$v; R] = std::array::from_fn(|r| $load(ws[r].add(k)));
                    for t in 0..T {
                        let xv = $load(xs[t].add(k));
                        for r in 0..R {
                            acc[r][t] = $fmav(wv[r], xv, acc[r][t]);
                        }
                    }
                    k += 16;
                }
                if full == n {
                    // in registers (`x86::reduce_add_16_halves`: the same additions)
                    return $reduce(&acc);
                }
                let mut out = [[0f32; T]; R];
                for r in 0..R {
                    for t in 0..T {
                        let mut l = [0f32; 16];
                        $store(l.as_mut_ptr(), acc[r][t]);
                        for i in full..n {
                            l[i % 16] = fma(*ws[r].add(i), *xs[t].add(i), l[i % 16]);
                        }
                        out[r][t] = reduce_add_16(&l);
                    }
                }
                out
            }

            /// [`super::matmul`] with these kernels.
            ///
            /// # Safety
            /// The CPU has the function's features; `w` holds `n_rows · cols` f32 and every `xs[t]` at
            /// least `cols`.
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $matmul(
                w: &[f32],
                cols: usize,
                n_rows: usize,
                xs: &[&[f32]],
                put: &mut impl FnMut(usize, usize, f32),
            ) {
                let row = |r: usize| w.as_ptr().add(r * cols);
                let n_tok = xs.len();
                if n_tok < $bt {
                    // few tokens (decode): $or rows at once, one token each
                    let mut r = 0;
                    while r + $or <= n_rows {
                        for (t, x) in xs.iter().enumerate() {
                            let o = $tile::<$or, 1>(
                                std::array::from_fn(|i| row(r + i)),
                                [x.as_ptr()],
                                cols,
                            );
                            for (i, v) in o.iter().enumerate() {
                                put(r + i, t, v[0]);
                            }
                        }
                        r += $or;
                    }
                    for r in r..n_rows {
                        for (t, x) in xs.iter().enumerate() {
                            put(r, t, $tile::<1, 1>([row(r)], [x.as_ptr()], cols)[0][0]);
                        }
                    }
                    return;
                }
                // token groups outermost (their activations stay in cache across the rows)
                let full_t = n_tok - n_tok % $bt;
                for t0 in (0..full_t).step_by($bt) {
                    let xp: [*const f32; $bt] = std::array::from_fn(|j| xs[t0 + j].as_ptr());
                    let mut r = 0;
                    while r + $br <= n_rows {
                        let o = $tile::<$br, $bt>(std::array::from_fn(|i| row(r + i)), xp, cols);
                        for (i, ov) in o.iter().enumerate() {
                            for (j, &v) in ov.iter().enumerate() {
                                put(r + i, t0 + j, v);
                            }
                        }
                        r += $br;
                    }
                    for r in r..n_rows {
                        let o = $tile::<1, $bt>([row(r)], xp, cols);
                        for (j, &v) in o[0].iter().enumerate() {
                            put(r, t0 + j, v);
                        }
                    }
                }
                for t in full_t..n_tok {
                    let mut r = 0;
                    while r + $or <= n_rows {
                        let o = $tile::<$or, 1>(
                            std::array::from_fn(|i| row(r + i)),
                            [xs[t].as_ptr()],
                            cols,
                        );
                        for (i, v) in o.iter().enumerate() {
                            put(r + i, t, v[0]);
                        }
                        r += $or;
                    }
                    for r in r..n_rows {
                        put(r, t, $tile::<1, 1>([row(r)], [xs[t].as_ptr()], cols)[0][0]);
                    }
                }
            }
        };
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load512(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn fma512(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn store512(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }

    /// Sixteen lanes as two `__m256` (lanes 0..8, 8..16).
    type Pair = (__m256, __m256);
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn load_pair(p: *const f32) -> Pair {
        (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn fma_pair(a: Pair, b: Pair, c: Pair) -> Pair {
        (
            _mm256_fmadd_ps(a.0, b.0, c.0),
            _mm256_fmadd_ps(a.1, b.1, c.1),
        )
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn store_pair(p: *mut f32, v: Pair) {
        _mm256_storeu_ps(p, v.0);
        _mm256_storeu_ps(p.add(8), v.1);
    }

    /// Every accumulator of a tile, one by one.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn reduce_pairs<const R: usize, const T: usize>(acc: &[[Pair; T]; R]) -> [[f32; T]; R] {
        std::array::from_fn(|r| {
            std::array::from_fn(|t| reduce_add_16_halves(acc[r][t].0, acc[r][t].1))
        })
    }

    kernels!(
        "avx512f", tile_avx512, matmul_avx512, __m512,
        zero: _mm512_setzero_ps(), load: load512, fma: fma512, store: store512,
        reduce: reduce_tile_512, big: (2, 8), one: 4
    );
    kernels!(
        "avx2,fma", tile_avx2, matmul_avx2, Pair,
        zero: (_mm256_setzero_ps(), _mm256_setzero_ps()), load: load_pair, fma: fma_pair,
        store: store_pair, reduce: reduce_pairs, big: (2, 2), one: 4
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut rng = crate::quant::test_rng::Rng(seed);
        move || ((rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
    }

    /// Every kernel kind this CPU has gives [`dot_scalar`]'s bits for every output, whatever the tile
    /// shape it lands in: row counts and token counts around the tile sizes, lengths with and without a
    /// tail, values spanning many binades (so a changed order would show).
    #[test]
    fn tiles_give_the_scalar_bits_for_every_shape() {
        let mut rnd = rng(0x9e37_79b9_7f4a_7c15);
        let kinds: Vec<Lanes16> = [Simd::Off, Simd::Avx2, Simd::Avx512]
            .into_iter()
            .filter(|s| s.available())
            .map(Lanes16::for_simd)
            .collect();
        for cols in [16usize, 37, 64, 96, 250] {
            for n_rows in [1usize, 2, 3, 5, 9] {
                for n_tok in [1usize, 2, 3, 7, 8, 9, 17] {
                    let w: Vec<f32> = (0..n_rows * cols)
                        .map(|i| rnd() * (1 << (i % 13)) as f32)
                        .collect();
                    let xs: Vec<Vec<f32>> = (0..n_tok)
                        .map(|_| (0..cols).map(|_| rnd()).collect())
                        .collect();
                    let xr: Vec<&[f32]> = xs.iter().map(|x| &x[..]).collect();
                    for &kind in &kinds {
                        let mut got = vec![f32::NAN; n_rows * n_tok];
                        let mut seen = 0;
                        matmul(kind, &w, cols, &xr, |r, t, v| {
                            got[r * n_tok + t] = v;
                            seen += 1;
                        });
                        assert_eq!(seen, n_rows * n_tok);
                        for r in 0..n_rows {
                            for t in 0..n_tok {
                                let want = dot_scalar(&w[r * cols..(r + 1) * cols], &xs[t]);
                                assert_eq!(
                                    got[r * n_tok + t].to_bits(),
                                    want.to_bits(),
                                    "{kind:?} cols {cols} rows {n_rows} tokens {n_tok} ({r}, {t})"
                                );
                                assert_eq!(
                                    dot(kind, &w[r * cols..(r + 1) * cols], &xs[t]).to_bits(),
                                    want.to_bits()
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The order is the documented one: lane `k % 16` fused, then the `_mm512_reduce_add_ps` tree — seen
    /// on values where a plain running sum or an unfused product gives other bits.
    #[test]
    fn the_order_is_sixteen_fused_lanes_then_the_reduce_tree() {
        // elements 0 and 16 share lane 0: 1e8 + 1 − 1e8 in one lane loses the 1
        let mut w = vec![0f32; 32];
        let x = vec![1f32; 32];
        w[0] = 1e8;
        w[16] = -1e8;
        w[1] = 1.0;
        assert_eq!(dot_scalar(&w, &x), 1.0);
        w[1] = 0.0;
        w[17] = 1.0;
        w[16] = 1.0;
        w[0] = 1e8;
        w[8] = -1e8;
        // lane 0 = 1e8 + 1 (rounds to 1e8), lane 8 = −1e8, lane 1 = 1: (l8 + l0) = 0, + l1 = 1
        assert_eq!(dot_scalar(&w, &x), 1.0);
        // fused: lane 0 = −1, then fma(1 + 2^-23, 1 − 2^-23, −1) = −2^-46 exactly, where a rounded
        // product (1) then an add gives 0
        let a = 1.0 + f32::EPSILON;
        let b = 1.0 - f32::EPSILON;
        let mut w = vec![0f32; 17];
        let mut x = vec![0f32; 17];
        w[0] = -1.0;
        x[0] = 1.0;
        w[16] = a;
        x[16] = b;
        assert_eq!(dot_scalar(&w, &x), a.mul_add(b, -1.0));
        assert_eq!(dot_scalar(&w, &x), -(2f32.powi(-46)));
    }
}
