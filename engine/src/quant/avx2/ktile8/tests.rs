//! The AVX2 K-quant tiles against the scalar spec (`vec_dot_path`), output by output: random
//! super-blocks (f16 scales sometimes random bit patterns: NaN, infinities, subnormals), activations
//! quantized by ggml mode's own `from_float` (NaN inputs included), the extremes of every integer, row
//! counts that are not a multiple of anything, and the whole backend matmul with ragged token counts.
use super::super::super::test_rng::{ggml_prepared, same, Rng};
use super::super::super::{simd_kernel, vec_dot_path, GgmlPath, GgmlType, PreparedRow};
use super::super::Q8kRow;
use super::{dot_rows_q4_k, dot_rows_q6_k, handles_q4_k, handles_q6_k, TOKENS};
use crate::numerics::{avx2_available, GgmlTarget, Numerics, Simd};

/// Random super-blocks of `ty` (Q4_K or Q6_K); their f16 scales ordinary magnitudes seven times in
/// eight, random bit patterns otherwise.
fn k_quant_row(ty: GgmlType, nb: usize, rng: &mut Rng) -> Vec<u8> {
    let per = ty.type_size();
    let mut w: Vec<u8> = (0..nb * per).map(|_| rng.next() as u8).collect();
    for blk in w.chunks_exact_mut(per) {
        if !rng.next().is_multiple_of(8) {
            let mut f16 = |lo: f32| {
                half::f16::from_f32(((rng.next() % 1000) as f32 + lo) * 1e-5).to_le_bytes()
            };
            match ty {
                GgmlType::Q4_K => {
                    let (d, m) = (f16(1.0), f16(0.0));
                    blk[0..2].copy_from_slice(&d);
                    blk[2..4].copy_from_slice(&m);
                }
                _ => blk[208..210].copy_from_slice(&f16(1.0)),
            }
        }
    }
    w
}

/// Super-blocks of `ty` filled with `fill` (every code, scale and min from it) with ordinary f16 scales.
fn filled_row(ty: GgmlType, nb: usize, fill: u8) -> Vec<u8> {
    let per = ty.type_size();
    let mut w = vec![fill; nb * per];
    let one = half::f16::from_f32(0.01).to_le_bytes();
    for blk in w.chunks_exact_mut(per) {
        match ty {
            GgmlType::Q4_K => {
                blk[0..2].copy_from_slice(&one);
                blk[2..4].copy_from_slice(&one);
            }
            _ => blk[208..210].copy_from_slice(&one),
        }
    }
    w
}

fn q8k(x: &PreparedRow) -> Q8kRow<'_> {
    Q8kRow {
        qs: &x.qs,
        d: &x.d,
        bsums: &x.bsums,
    }
}

/// Every output of the tile for the `n_rows` rows `w` (one buffer) and the eight tokens `xs` on `path`
/// against `vec_dot_path`; returns the number of outputs compared.
fn check(ty: GgmlType, w: &[u8], n_rows: usize, xs: &[PreparedRow], path: GgmlPath) -> usize {
    assert_eq!(xs.len(), TOKENS);
    let rb = w.len() / n_rows;
    let x8: [Q8kRow<'_>; TOKENS] = std::array::from_fn(|t| q8k(&xs[t]));
    let mut out = vec![vec![f32::NAN; n_rows]; TOKENS];
    let mut it = out.iter_mut();
    let mut outs: [&mut [f32]; TOKENS] = std::array::from_fn(|_| &mut it.next().unwrap()[..]);
    // SAFETY: the callers checked `avx2_available`; the kernels check the shapes
    unsafe {
        match ty {
            GgmlType::Q4_K => dot_rows_q4_k(w, rb, n_rows, x8, path, &mut outs),
            _ => dot_rows_q6_k(w, rb, n_rows, x8, &mut outs),
        }
    }
    for (t, o) in out.iter().enumerate() {
        for (i, &got) in o.iter().enumerate() {
            let want = vec_dot_path(ty, &w[i * rb..(i + 1) * rb], &xs[t], path);
            assert!(
                same(got, want),
                "{ty} {path:?} nb {} row {i} token {t}: tile {got:e} vs scalar {want:e}",
                xs[0].n_blocks()
            );
        }
    }
    n_rows * TOKENS
}

const CASES: [(GgmlType, GgmlPath); 3] = [
    (GgmlType::Q4_K, GgmlPath::RepackGemm),
    (GgmlType::Q4_K, GgmlPath::Tiled),
    (GgmlType::Q6_K, GgmlPath::Tiled),
];

#[test]
fn tiles_give_the_scalar_bits_on_random_blocks() {
    if !avx2_available() {
        eprintln!("skipping: this CPU has no AVX2+FMA+F16C");
        return;
    }
    let mut rng = Rng(0x7e11_8a5e_0045_0002);
    let mut n = 0;
    for (ty, path) in CASES {
        for nb in [1, 2, 3, 7] {
            for n_rows in [1, 3, 8, 13] {
                let w: Vec<u8> = (0..n_rows)
                    .flat_map(|_| k_quant_row(ty, nb, &mut rng))
                    .collect();
                let xs: Vec<PreparedRow> = (0..TOKENS)
                    .map(|_| {
                        let x: Vec<f32> =
                            (0..nb * 256).map(|_| rng.activation(512, true)).collect();
                        ggml_prepared(ty, &x)
                    })
                    .collect();
                n += check(ty, &w, n_rows, &xs, path);
            }
        }
    }
    assert_eq!(n, 3 * 4 * (1 + 3 + 8 + 13) * TOKENS);
}

/// Codes, scales and mins at their extremes (bytes 0xFF: Q4_K nibbles 15, scales and mins 63; Q6_K
/// codes 63, scales −1; 0x80: Q6_K scales −128; and mixed patterns) against activation rows whose Q8_K
/// quants are all −127 (a constant row), alternate ±127, or hold NaN inputs.
#[test]
fn tiles_give_the_scalar_bits_on_extreme_blocks() {
    if !avx2_available() {
        eprintln!("skipping: this CPU has no AVX2+FMA+F16C");
        return;
    }
    let mut rng = Rng(0x7e11_8a5e_0045_0003);
    let nb = 3;
    let n = nb * 256;
    let inputs: Vec<Vec<f32>> = vec![
        (0..n).map(|_| 1.5).collect(),
        (0..n).map(|_| -0.25).collect(),
        (0..n)
            .map(|i| if i % 2 == 0 { 2.0 } else { -2.0 })
            .collect(),
        (0..n)
            .map(|i| if i % 3 == 0 { -3.0 } else { 3.0 })
            .collect(),
        (0..n).map(|_| 0.0).collect(),
        (0..n).map(|_| rng.activation(512, true)).collect(),
        (0..n)
            .map(|i| if i % 16 < 8 { 1.0 } else { -1.0 })
            .collect(),
        (0..n)
            .map(|i| if i % 5 == 0 { f32::NAN } else { -1.0 })
            .collect(),
    ];
    let mut count = 0;
    for (ty, path) in CASES {
        let xs: Vec<PreparedRow> = inputs.iter().map(|x| ggml_prepared(ty, x)).collect();
        assert!(
            xs[0].qs.iter().all(|&q| q == -127),
            "a constant row quantizes to -127"
        );
        for fill in [0xFFu8, 0x00, 0x80, 0xAA, 0x55, 0x0F, 0xF0] {
            let w: Vec<u8> = (0..3).flat_map(|_| filled_row(ty, nb, fill)).collect();
            count += check(ty, &w, 3, &xs, path);
        }
    }
    assert_eq!(count, 3 * 7 * 3 * TOKENS);
}

/// The AVX2 kernels run the tile exactly for a group of eight tokens on one path it has, and a call
/// through the kernel (`SimdKernel::dot`, the backend's entry) gives the scalar bits on every path,
/// mixed paths included (which the tile does not take).
#[test]
fn avx2_kernels_give_the_scalar_bits_with_and_without_the_tile() {
    use GgmlPath::*;
    assert!(handles_q4_k(&[RepackGemm; 8]) && handles_q4_k(&[Tiled; 8]));
    assert!(!handles_q4_k(&[RepackGemv; 8]) && !handles_q4_k(&[VecDot; 8]));
    let mut mixed = [RepackGemm; 8];
    mixed[7] = RepackGemv;
    assert!(!handles_q4_k(&mixed) && !handles_q4_k(&[Tiled; 4]));
    assert!(handles_q6_k(&[Tiled; 8]) && !handles_q6_k(&[VecDot; 8]));
    if !avx2_available() {
        eprintln!("skipping: this CPU has no AVX2+FMA+F16C");
        return;
    }
    let mut rng = Rng(0x7e11_8a5e_0045_0004);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let k = simd_kernel(
            Numerics::ggml(GgmlTarget::default()).with_simd(Simd::Avx2),
            ty,
        )
        .expect("an AVX2 kernel");
        let nb = 2;
        let w: [Vec<u8>; 3] = std::array::from_fn(|_| k_quant_row(ty, nb, &mut rng));
        let xs: Vec<PreparedRow> = (0..TOKENS)
            .map(|_| {
                let x: Vec<f32> = (0..nb * 256).map(|_| rng.activation(512, true)).collect();
                ggml_prepared(ty, &x)
            })
            .collect();
        let x8: [&PreparedRow; 8] = std::array::from_fn(|j| &xs[j]);
        let mut gemv_tail = [RepackGemm; 8];
        gemv_tail[5..].fill(RepackGemv);
        for paths in [[Tiled; 8], [RepackGemm; 8], [VecDot; 8], mixed, gemv_tail] {
            let got = k.dot([&w[0], &w[1], &w[2]], x8, paths);
            for (r, row) in got.iter().enumerate() {
                for (t, &g) in row.iter().enumerate() {
                    let want = vec_dot_path(ty, &w[r], &xs[t], paths[t]);
                    assert!(
                        same(g, want),
                        "{ty} {:?} row {r} token {t}: {g:e} vs {want:e}",
                        paths[t]
                    );
                }
            }
        }
    }
}

/// The whole matmul through the backend with SIMD off (the scalar spec), AVX2 (these tiles for every
/// group of eight) and, where the CPU has it, AVX-512 (its 16-token tiles, these for the groups of
/// eight left over): the same bits for row counts that are repacked (24) or not (20, 13), token counts
/// with ragged tails (a repacked batch's gemv rows, the tokens past a multiple of eight).
#[test]
fn matmul_with_avx2_k_tiles_gives_the_scalar_bits() {
    use crate::backend::{Backend, CpuBackend, MatmulScratch, QMatrix};
    if !avx2_available() {
        eprintln!("skipping: this CPU has no AVX2+FMA+F16C");
        return;
    }
    let mut rng = Rng(0x7e11_8a5e_0045_0005);
    let mut settings = vec![Simd::Avx2];
    if Simd::Avx512.available() {
        settings.push(Simd::Avx512);
    }
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        for rows in [24, 20, 13] {
            let cols = 768;
            let w: Vec<u8> = (0..rows)
                .flat_map(|_| k_quant_row(ty, cols / 256, &mut rng))
                .collect();
            let m = QMatrix {
                ty,
                rows,
                cols,
                data: &w,
                repacked: None,
            };
            for n_tokens in [8, 11, 16, 23, 26, 40] {
                let x: Vec<f32> = (0..n_tokens * cols)
                    .map(|_| rng.activation(256, true))
                    .collect();
                let run = |simd: Simd| {
                    let mut out = vec![0f32; n_tokens * rows];
                    let num = Numerics::ggml(GgmlTarget::default()).with_simd(simd);
                    CpuBackend::new(simd)
                        .matmul(
                            &m,
                            &x,
                            n_tokens,
                            &mut out,
                            num,
                            &mut MatmulScratch::default(),
                        )
                        .unwrap();
                    out
                };
                let want = run(Simd::Off);
                for &simd in &settings {
                    let got = run(simd);
                    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                        assert!(
                            same(*a, *b),
                            "{ty} rows {rows} tokens {n_tokens} {simd} output {i}: \
                             scalar {a:e} vs {b:e}"
                        );
                    }
                }
            }
        }
    }
}
