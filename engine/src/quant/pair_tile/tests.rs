//! The pair tiles against the scalar spec (`vec_dot_path`), output by output: random blocks (f16
//! scales sometimes random bit patterns), activations quantized by ggml mode's own `from_float`, the
//! integer extremes, a group with a −128 quant refused, and whole matmuls with SIMD off, AVX2 and
//! AVX-512 giving the same bits (NaN inputs included).
use super::super::test_rng::{avx512_tile_kernel, blocks_with_f16_scale, ggml_prepared, same, Rng};
use super::super::{vec_dot_path, GgmlPath, GgmlType, PreparedRow, SimdKernel, Wide};
use super::{accepts, build_tile, tile_lines, Line, TOKENS};
use crate::numerics::Simd;

/// Random blocks of `ty` (Q5_0 or Q8_0); their f16 scales ordinary magnitudes half of the time.
fn weight_row(ty: GgmlType, nb: usize, rng: &mut Rng) -> Vec<u8> {
    blocks_with_f16_scale(ty, nb, 1e-5, rng)
}

fn prepared(ty: GgmlType, x: &[f32]) -> PreparedRow {
    ggml_prepared(ty, x)
}

/// The pair-tile kernel of `ty` (None without AVX-512 VNNI on this CPU).
fn kernel(ty: GgmlType) -> Option<SimdKernel> {
    avx512_tile_kernel(ty, Wide::Pairs(ty))
}

/// Every output of `dot_rows_wide` for the rows `w` (one buffer) and `xs` against `vec_dot_path`.
fn check(k: SimdKernel, ty: GgmlType, w: &[u8], n_rows: usize, xs: &[PreparedRow]) -> usize {
    let rb = w.len() / n_rows;
    let xs16: [&PreparedRow; TOKENS] = std::array::from_fn(|t| &xs[t]);
    assert!(accepts(&xs16));
    let mut tile = vec![Line::default(); tile_lines(xs[0].n_blocks())];
    build_tile(xs16, &mut tile);
    let mut out = vec![vec![f32::NAN; n_rows]; TOKENS];
    let mut it = out.iter_mut();
    let outs: [&mut [f32]; TOKENS] = std::array::from_fn(|_| &mut it.next().unwrap()[..]);
    k.dot_rows_wide(w, rb, n_rows, &tile, GgmlPath::VecDot, outs);
    for (t, o) in out.iter().enumerate() {
        for (i, &got) in o.iter().enumerate() {
            let want = vec_dot_path(ty, &w[i * rb..(i + 1) * rb], &xs[t], GgmlPath::VecDot);
            assert!(
                same(got, want),
                "{ty} nb {} row {i} token {t}: tile {got:e} vs scalar {want:e}",
                xs[0].n_blocks()
            );
        }
    }
    n_rows * TOKENS
}

#[test]
fn pair_tiles_give_the_scalar_bits_on_random_blocks() {
    let mut rng = Rng(0x009a_1f0f_7153);
    let mut n = 0;
    for ty in [GgmlType::Q5_0, GgmlType::Q8_0] {
        let Some(k) = kernel(ty) else { return };
        for nb in [1, 2, 3, 5, 20, 28] {
            for _ in 0..3 {
                // odd and even row counts: the two-row steps and the last single row
                let n_rows = 1 + (rng.next() % 5) as usize;
                let w: Vec<u8> = (0..n_rows)
                    .flat_map(|_| weight_row(ty, nb, &mut rng))
                    .collect();
                let xs: Vec<PreparedRow> = (0..TOKENS)
                    .map(|_| {
                        let x: Vec<f32> =
                            (0..nb * 32).map(|_| rng.activation(256, false)).collect();
                        prepared(ty, &x)
                    })
                    .collect();
                n += check(k, ty, &w, n_rows, &xs);
            }
        }
    }
    assert!(n > 1000, "{n}");
}

#[test]
fn pair_tiles_give_the_scalar_bits_at_the_integer_extremes_and_refuse_a_min_quant() {
    for ty in [GgmlType::Q5_0, GgmlType::Q8_0] {
        let Some(k) = kernel(ty) else { return };
        let nb = 3;
        let per = ty.type_size();
        // weights at their extremes: all bits set (Q5_0: 31 − 16 = 15; Q8_0: −1), 0x80 (Q8_0: −128),
        // 0x7F (Q8_0: 127) and zero bits (Q5_0: −16)
        let mut w = Vec::new();
        for fill in [0xFFu8, 0x80, 0x7F, 0x00] {
            let mut r = vec![fill; nb * per];
            for blk in r.chunks_exact_mut(per) {
                blk[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
            w.extend(r);
        }
        let xs: Vec<PreparedRow> = (0..TOKENS)
            .map(|t| {
                let x: Vec<f32> = (0..nb * 32)
                    .map(|i| match t % 3 {
                        0 => -1.0,
                        1 => 1.0,
                        _ if i % 2 == 0 => 1.0,
                        _ => -0.25,
                    })
                    .collect();
                prepared(ty, &x)
            })
            .collect();
        assert!(xs[0].qs.iter().all(|&q| q == -127) && xs[1].qs.iter().all(|&q| q == 127));
        check(k, ty, &w, 4, &xs);
        // a NaN input quantizes to −128: that group is not tiled
        let mut x: Vec<f32> = vec![0.5; nb * 32];
        x[5] = f32::NAN;
        let nan = prepared(ty, &x);
        let mut xs16: [&PreparedRow; TOKENS] = std::array::from_fn(|t| &xs[t]);
        assert!(accepts(&xs16));
        xs16[9] = &nan;
        assert!(!accepts(&xs16));
        assert!(!Wide::Pairs(ty).accepts(&xs16, GgmlPath::VecDot));
    }
}

/// Whole matmuls of Q5_0 and Q8_0 weights with SIMD off, AVX2 and AVX-512 (pair tiles, their refused
/// groups, the last group of 8 and single tokens) give the same bits, NaN inputs included.
#[test]
fn matmul_with_pair_tiles_gives_the_avx2_and_scalar_bits() {
    use crate::backend::{assert_matmul_same_bits_on_every_simd, QMatrix};
    if !Simd::Avx512.available() {
        eprintln!("skipping: this CPU has no AVX-512 VNNI");
        return;
    }
    let mut rng = Rng(0xabad_1dea_5eed);
    for ty in [GgmlType::Q5_0, GgmlType::Q8_0] {
        let (rows, cols) = (37, 160);
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| weight_row(ty, cols / 32, &mut rng))
            .collect();
        let m = QMatrix {
            ty,
            rows,
            cols,
            data: &w,
            repacked: None,
        };
        for (n_tokens, nan) in [(16, false), (35, false), (48, true), (57, true)] {
            let x: Vec<f32> = (0..n_tokens * cols)
                .map(|_| rng.activation(256, nan))
                .collect();
            assert_matmul_same_bits_on_every_simd(&m, &x, n_tokens, &format!("{ty}"));
        }
    }
}
