//! BF16 weights in ggml mode on a CPU with AVX512-BF16: the `__AVX512BF16__` branches of ggml-cpu run
//! on the instruction they were written for, `vdpbf16ps` (`_mm512_dpbf16_ps`), instead of its lane-by-lane
//! emulation (`avx2_float.rs`, which an AVX-512 build's goldens need on a CPU without the instruction).
//!
//! - [`GgmlPath::VecDot`]: `ggml_vec_dot_bf16` (ggml-cpu/vec.cpp, `__AVX512BF16__` branch): over chunks
//!   of 64 elements, `c1 = _mm512_dpbf16_ps(c1, x[i..i+32], y[i..i+32])` and `c2` likewise for
//!   `i+32..i+64`; `sumf += _mm512_reduce_add_ps(c1)`, then `c2`, into a double; leftovers
//!   `sumf += (double)(w * x)` with the product rounded to f32; the sum rounded to f32 (the scalar
//!   specification: `float::dot_bf16`).
//! - [`GgmlPath::TinyBlas`]: llamafile's `tinyBLAS<32, __m512, __m512bh, ggml_bf16_t, ggml_bf16_t,
//!   float>` (ggml-cpu/llamafile/sgemm.cpp, `gemm_bloc`): one 16-lane accumulator per output,
//!   `madd(a, b, c) = _mm512_dpbf16_ps(c, a, b)` over chunks of `KN` = 32 elements in order, then
//!   `hsum` = `_mm512_reduce_add_ps` (the scalar specification: `float::dot_tinyblas`). Here a tile of
//!   two weight rows × the call's tokens shares each load, which changes no output's arithmetic.
//!
//! The activation is the row rounded to bf16 by ggml mode's `prepare` (`ggml_cpu_fp32_to_bf16`), read
//! from its bf16 bytes (`PreparedRow::blocks`). `_mm512_reduce_add_ps` is the scalar tree
//! `x86::reduce_add_16` (in registers: `x86::reduce_add_16_512`); `vdpbf16ps` itself — odd pair then even pair, DAZ in, FTZ out, round to nearest
//! even (Intel SDM) — is the hardware's, so these kernels give the bits of the llama.cpp build they mirror
//! by construction, and the tests hold them to the scalar emulation as well.

use std::arch::x86_64::*;

use super::fp::{bf16_to_f32, read_u16};
use super::x86::{reduce_add_16_512 as reduce, reduce_tile_512 as reduce_tile};
use super::{GgmlPath, PreparedRow};

/// True if this CPU has the instructions of these kernels (AVX-512 F and BW, and AVX512-BF16).
pub(crate) fn available() -> bool {
    crate::numerics::cpu_has("avx512f")
        && crate::numerics::cpu_has("avx512bw")
        && crate::numerics::cpu_has("avx512bf16")
}

/// True if these kernels compute every path of a call: the two `__AVX512BF16__` paths of BF16 weights.
pub(crate) fn handles(paths: &[GgmlPath]) -> bool {
    paths
        .iter()
        .all(|p| matches!(p, GgmlPath::VecDot | GgmlPath::TinyBlas))
}

/// 32 bf16 values at `p` (unaligned).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn load_bh(p: *const u8) -> __m512bh {
    // SAFETY (of the transmute): `__m512i` and `__m512bh` are both 64 plain bytes
    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p as *const __m512i))
}

/// tinyBLAS outputs of `R` weight rows × `T` activation rows (bf16 bytes, `n` elements each): chunks
/// of 32 elements through `vdpbf16ps`, a trailing `n % 32` ignored (tinyBLAS runs only where `KN`
/// divides the row: `float::tinyblas_applies`).
///
/// # Safety
/// The CPU has AVX-512 F/BW and AVX512-BF16; every pointer reads `2·n` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn tinyblas_tile<const R: usize, const T: usize>(
    ws: [*const u8; R],
    xs: [*const u8; T],
    n: usize,
) -> [[f32; T]; R] {
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let full = n - n % 32;
    let mut k = 0;
    while k < full {
        let wv: [__m512bh; R] = std::array::from_fn(|r| load_bh(ws[r].add(2 * k)));
        for t in 0..T {
            let xv = load_bh(xs[t].add(2 * k));
            for r in 0..R {
                acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
            }
        }
        k += 32;
    }
    reduce_tile(&acc)
}

/// `ggml_vec_dot_bf16`'s `__AVX512BF16__` branch on one weight row `w` and one activation row (`x_bh` its
/// bf16 bytes, `x` the same values widened), `n` elements.
///
/// # Safety
/// As [`tinyblas_tile`]; `x` holds `n` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn vec_dot(w: *const u8, x_bh: *const u8, x: &[f32], n: usize) -> f32 {
    let mut c1 = _mm512_setzero_ps();
    let mut c2 = _mm512_setzero_ps();
    let mut i = 0;
    while i + 64 <= n {
        c1 = _mm512_dpbf16_ps(c1, load_bh(w.add(2 * i)), load_bh(x_bh.add(2 * i)));
        c2 = _mm512_dpbf16_ps(
            c2,
            load_bh(w.add(2 * i + 64)),
            load_bh(x_bh.add(2 * i + 64)),
        );
        i += 64;
    }
    let mut sumf = f64::from(reduce(c1));
    sumf += f64::from(reduce(c2));
    let wr = std::slice::from_raw_parts(w, 2 * n);
    for (j, &xj) in x.iter().enumerate().take(n).skip(i) {
        sumf += f64::from(bf16_to_f32(read_u16(wr, 2 * j)) * xj);
    }
    sumf as f32
}

/// `outs[t][i]` = the output of BF16 weight row `i` (of `n_rows` rows of `row_bytes` bytes in `rows`) and
/// activation row `xs[t]` on ggml path `paths[t]` ([`GgmlPath::VecDot`] or [`GgmlPath::TinyBlas`]), bit
/// for bit `float::dot_bf16` / `float::dot_tinyblas`. When every token is on tinyBLAS, two weight rows
/// at a time against all `N` tokens.
///
/// # Safety
/// The CPU has AVX-512 F/BW and AVX512-BF16 ([`available`]).
///
/// # Panics
/// If a path is not one of the two ([`handles`]), `rows` is shorter than `n_rows` rows, an activation row
/// does not hold `row_bytes / 2` elements (and their bf16 bytes), or an output is shorter than `n_rows`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(crate) unsafe fn dot_rows<const N: usize>(
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    xs: [&PreparedRow; N],
    paths: [GgmlPath; N],
    outs: &mut [&mut [f32]; N],
) {
    assert!(
        handles(&paths),
        "not a path of the AVX512-BF16 kernels: {paths:?}"
    );
    let n = row_bytes / 2;
    assert!(rows.len() >= n_rows * row_bytes && row_bytes == 2 * n);
    for x in &xs {
        assert!(
            x.x.len() == n && x.blocks.len() == 2 * n,
            "activation row of {n}"
        );
    }
    assert!(outs.iter().all(|o| o.len() >= n_rows));
    let row = |i: usize| rows.as_ptr().add(i * row_bytes);
    let xb: [*const u8; N] = std::array::from_fn(|t| xs[t].blocks.as_ptr());
    let mut i = 0;
    if N > 1 && paths.iter().all(|&p| p == GgmlPath::TinyBlas) {
        while i + 2 <= n_rows {
            let o = tinyblas_tile::<2, N>([row(i), row(i + 1)], xb, n);
            for (t, out) in outs.iter_mut().enumerate() {
                out[i] = o[0][t];
                out[i + 1] = o[1][t];
            }
            i += 2;
        }
    }
    for i in i..n_rows {
        for (t, out) in outs.iter_mut().enumerate() {
            out[i] = match paths[t] {
                GgmlPath::TinyBlas => tinyblas_tile::<1, 1>([row(i)], [xb[t]], n)[0][0],
                _ => vec_dot(row(i), xb[t], &xs[t].x, n),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_rng::{ggml_prepared, same, Rng};
    use super::super::{simd_kernel, vec_dot_path, GgmlType, SimdKernel};
    use super::*;
    use crate::numerics::{GgmlTarget, Numerics, Simd};

    /// A BF16 row of `n` values: ordinary ones of mixed sign, outliers, values near the bottom of f32's
    /// normal range (products below it: `vdpbf16ps` flushes them, a plain fma would not), subnormals
    /// (read as zero) and, if `specials`, a few random bit patterns (NaN, inf).
    fn row(n: usize, specials: bool, rng: &mut Rng) -> Vec<u8> {
        let mut b = Vec::with_capacity(2 * n);
        for _ in 0..n {
            let u = rng.uniform();
            let v = match rng.next() % 16 {
                0 => u * 1.5e-38,
                1 => u * 1e-40,
                2 => u * 300.0,
                3 if specials => f32::from_bits((rng.next() as u32) | 0x7f80_0000),
                _ => u,
            };
            b.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes());
        }
        b
    }

    #[test]
    fn vdpbf16ps_kernels_give_the_emulated_bits_on_both_paths_one_to_eight_tokens() {
        let num = Numerics::ggml(GgmlTarget::Avx512).with_simd(Simd::Avx512);
        if !(Simd::Avx512.available() && available()) {
            eprintln!("skipping: this CPU has no AVX-512 VNNI with AVX512-BF16");
            return;
        }
        let k = simd_kernel(num, GgmlType::BF16).expect("a SIMD kernel");
        assert_eq!(k, SimdKernel::BF16Avx512);
        let mut rng = Rng(0xbf16_d0d0_0000_0001);
        let mut cases = 0;
        let mut flushed = 0;
        for n in [32, 64, 96, 576, 1536, 40, 200, 1000] {
            for trial in 0..4 {
                // three weight rows (a tile pair and a leftover row), eight activation rows
                let w: Vec<Vec<u8>> = (0..3).map(|_| row(n, trial == 3, &mut rng)).collect();
                let xs: Vec<PreparedRow> = (0..8)
                    .map(|_| {
                        let x: Vec<f32> = (0..n).map(|_| rng.activation(512, trial == 3)).collect();
                        let mut x = x;
                        // activations near the bottom of the normal range too
                        for v in x.iter_mut().step_by(7) {
                            *v *= 1e-37;
                        }
                        ggml_prepared(GgmlType::BF16, &x)
                    })
                    .collect();
                let x8: [&PreparedRow; 8] = std::array::from_fn(|j| &xs[j]);
                let w3 = [&w[0][..], &w[1][..], &w[2][..]];
                for paths in [
                    [GgmlPath::TinyBlas; 8],
                    [GgmlPath::VecDot; 8],
                    std::array::from_fn(|j| [GgmlPath::TinyBlas, GgmlPath::VecDot][j % 2]),
                ] {
                    let got = k.dot(w3, x8, paths);
                    for (r, wr) in w.iter().enumerate() {
                        for (t, x) in xs.iter().enumerate() {
                            let want = vec_dot_path(GgmlType::BF16, wr, x, paths[t]);
                            assert!(
                                same(got[r][t], want),
                                "n {n} trial {trial} row {r} token {t} {:?}: {:e} vs emulated {want:e}",
                                paths[t],
                                got[r][t]
                            );
                            let one = k.dot([&wr[..]], [x], [paths[t]])[0][0];
                            assert!(same(one, want), "n {n} one token: {one:e} vs {want:e}");
                            cases += 1;
                        }
                    }
                }
                // the emulation's flush matters on these rows: a product below f32's normal range
                flushed += usize::from(w[0].chunks_exact(2).zip(&xs[0].x).any(|(b, &x)| {
                    let p = bf16_to_f32(u16::from_le_bytes([b[0], b[1]])) * x;
                    p != 0.0 && p.abs() < f32::MIN_POSITIVE
                }));
            }
        }
        assert!(
            cases > 1000 && flushed > 10,
            "{cases} cases, {flushed} with tiny products"
        );
    }

    #[test]
    fn other_paths_and_cpus_without_the_instruction_take_the_avx2_kernel() {
        assert!(!handles(&[GgmlPath::TinyBlasNoBf16]));
        assert!(!handles(&[GgmlPath::VecDot, GgmlPath::VecDotAvx2]));
        let num = Numerics::ggml(GgmlTarget::Avx512).with_simd(Simd::Avx2);
        if crate::numerics::avx2_available() {
            assert_eq!(simd_kernel(num, GgmlType::BF16), Some(SimdKernel::BF16Avx2));
        }
        if Simd::Avx512.available() && !available() {
            let k = simd_kernel(num.with_simd(Simd::Avx512), GgmlType::BF16);
            assert_eq!(k, Some(SimdKernel::BF16Avx2));
        }
    }
}
