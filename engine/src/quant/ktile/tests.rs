//! The K-quant tiles against the scalar spec (`vec_dot_path`), output by output: random super-blocks
//! (f16 scales sometimes random bit patterns: NaN, infinities, subnormals), activations quantized by
//! ggml mode's own `from_float` (NaN inputs included: they quantize to −128), and the extremes of every
//! integer (all quants at their largest, scales and mins at 63 / −128, activations at ±127 and −128).
use super::super::test_rng::{avx512_tile_kernel, ggml_prepared, same, Rng};
use super::super::{vec_dot_path, GgmlPath, GgmlType, PreparedRow, SimdKernel, Wide};
use super::{build_tile, handles, tile_lines, Line, TOKENS};
use crate::numerics::Simd;

/// Random super-blocks of `ty`; their f16 scales ordinary magnitudes seven times in eight.
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

/// The extreme super-blocks of `ty`: every quant at its largest, scales (and mins) at their extremes.
fn extreme_row(ty: GgmlType, nb: usize) -> Vec<u8> {
    let per = ty.type_size();
    let mut w = vec![0xFFu8; nb * per];
    let one = half::f16::from_f32(0.01).to_le_bytes();
    for blk in w.chunks_exact_mut(per) {
        match ty {
            // 6-bit scales and mins all 63, nibbles all 15
            GgmlType::Q4_K => {
                blk[0..2].copy_from_slice(&one);
                blk[2..4].copy_from_slice(&one);
            }
            // quants all 63 (q − 32 = 31), scales −128
            _ => {
                blk[192..208].fill(0x80);
                blk[208..210].copy_from_slice(&one);
            }
        }
    }
    w
}

fn prepared(ty: GgmlType, x: &[f32]) -> PreparedRow {
    ggml_prepared(ty, x)
}

/// The tile kernel of `ty` (None without AVX-512 VNNI on this CPU).
fn kernel(ty: GgmlType) -> Option<SimdKernel> {
    avx512_tile_kernel(ty, Wide::K(ty))
}

/// Every output of `dot_rows_wide` for the rows `w` (one buffer) and `xs` against `vec_dot_path`;
/// returns the number of outputs compared.
fn check(
    k: SimdKernel,
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    xs: &[PreparedRow],
    path: GgmlPath,
) -> usize {
    let rb = w.len() / n_rows;
    let xs16: [&PreparedRow; TOKENS] = std::array::from_fn(|t| &xs[t]);
    let mut tile = vec![Line::default(); tile_lines(xs[0].n_blocks())];
    build_tile(ty, xs16, &mut tile);
    let mut out = vec![vec![f32::NAN; n_rows]; TOKENS];
    let mut it = out.iter_mut();
    let outs: [&mut [f32]; TOKENS] = std::array::from_fn(|_| &mut it.next().unwrap()[..]);
    k.dot_rows_wide(w, rb, n_rows, &tile, path, outs);
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
fn k_tiles_give_the_scalar_bits_on_random_blocks() {
    let mut rng = Rng(0x5eed_0fc0_ffee);
    let mut n = 0;
    for (ty, path) in CASES {
        assert!(handles(ty, path));
        let Some(k) = kernel(ty) else { return };
        for nb in [1, 2, 3, 4, 7, 19] {
            for _ in 0..3 {
                let n_rows = 1 + (rng.next() % 5) as usize;
                let w: Vec<u8> = (0..n_rows)
                    .flat_map(|_| k_quant_row(ty, nb, &mut rng))
                    .collect();
                let xs: Vec<PreparedRow> = (0..TOKENS)
                    .map(|_| {
                        let x: Vec<f32> =
                            (0..nb * 256).map(|_| rng.activation(256, true)).collect();
                        prepared(ty, &x)
                    })
                    .collect();
                n += check(k, ty, &w, n_rows, &xs, path);
            }
        }
    }
    assert!(n > 1000, "{n}");
}

#[test]
fn k_tiles_give_the_scalar_bits_at_the_integer_extremes() {
    let mut n = 0;
    for (ty, path) in CASES {
        let Some(k) = kernel(ty) else { return };
        for nb in [1, 3] {
            let w = [extreme_row(ty, nb), extreme_row(ty, nb)].concat();
            // activations at −127 and +127 (all one sign: the largest sums), −128 (a NaN in the block)
            // and mixed signs
            let xs: Vec<PreparedRow> = (0..TOKENS)
                .map(|t| {
                    let x: Vec<f32> = (0..nb * 256)
                        .map(|i| match t % 4 {
                            0 => -1.0,
                            1 => 1.0,
                            2 if i % 256 == 7 => f32::NAN,
                            2 => -1.0,
                            _ if i % 2 == 0 => 1.0,
                            _ => -0.5,
                        })
                        .collect();
                    prepared(ty, &x)
                })
                .collect();
            assert!(
                xs[0].qs.iter().all(|&q| q == -127),
                "the extreme activation quants"
            );
            n += check(k, ty, &w, 2, &xs, path);
        }
    }
    assert!(n > 0);
}

/// The tile's kernels and the AVX2 kernels they replace give the same outputs through the backend's
/// matmul (batch sizes with K-quant tiles, a repacked batch's gemv tail, and leftovers of 8 and 1).
#[test]
fn matmul_with_k_tiles_gives_the_avx2_and_scalar_bits() {
    use crate::backend::{assert_matmul_same_bits_on_every_simd, QMatrix};
    if !Simd::Avx512.available() {
        eprintln!("skipping: this CPU has no AVX-512 VNNI");
        return;
    }
    let mut rng = Rng(0xfeed_beef_1234);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        // 24 rows: repacked Q4_K; 20 rows: Q4_K not repacked (tiled from 8 tokens on)
        for rows in [24, 20] {
            let cols = 512;
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
            for n_tokens in [16, 19, 35, 42] {
                let x: Vec<f32> = (0..n_tokens * cols)
                    .map(|_| rng.activation(256, true))
                    .collect();
                assert_matmul_same_bits_on_every_simd(
                    &m,
                    &x,
                    n_tokens,
                    &format!("{ty} rows {rows}"),
                );
            }
        }
    }
}
