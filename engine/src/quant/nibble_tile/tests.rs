//! The nibble tiles against the scalar spec (`vec_dot_path` on the repacked gemm), output by output:
//! random blocks (f16 scales sometimes random bit patterns: NaN, inf, subnormal), activations quantized
//! by ggml mode's own `from_float` (NaN inputs give −128 quants, which the tile takes exactly), the
//! integer extremes, row counts around the sixteen-row step, and whole matmuls with SIMD off, AVX2 and
//! AVX-512 giving the same bits.
use super::super::test_rng::{avx512_tile_kernel, blocks_with_f16_scale, ggml_prepared, same, Rng};
use super::super::{vec_dot_path, GgmlPath, GgmlType, PreparedRow, SimdKernel, Wide};
use super::{build_tile, handles, tile_lines, Line, TOKENS};
use crate::numerics::Simd;

const TYPES: [GgmlType; 2] = [GgmlType::Q4_0, GgmlType::IQ4_NL];

/// Random blocks of `ty` (Q4_0 or IQ4_NL: 18 bytes); their f16 scales ordinary magnitudes half of the
/// time, random bits (NaN, inf, subnormal included) otherwise.
fn weight_row(ty: GgmlType, nb: usize, rng: &mut Rng) -> Vec<u8> {
    blocks_with_f16_scale(ty, nb, 1e-4, rng)
}

fn prepared(ty: GgmlType, x: &[f32]) -> PreparedRow {
    ggml_prepared(ty, x)
}

/// The nibble-tile kernel of `ty` (None without AVX-512 VNNI on this CPU).
fn kernel(ty: GgmlType) -> Option<SimdKernel> {
    avx512_tile_kernel(ty, Wide::Nibbles(ty))
}

/// Every output of `dot_rows_wide` for the rows `w` (one buffer) and `xs` against `vec_dot_path` on
/// the repacked gemm; returns the number of outputs checked.
fn check(k: SimdKernel, ty: GgmlType, w: &[u8], n_rows: usize, xs: &[PreparedRow]) -> usize {
    let rb = w.len() / n_rows;
    let xs16: [&PreparedRow; TOKENS] = std::array::from_fn(|t| &xs[t]);
    assert!(Wide::Nibbles(ty).accepts(&xs16, GgmlPath::RepackGemm));
    let mut tile = vec![Line::default(); tile_lines(xs[0].n_blocks())];
    build_tile(ty, xs16, &mut tile);
    // one float past the rows in every output: the masked last step must not write it
    let mut out = vec![vec![f32::NAN; n_rows + 1]; TOKENS];
    for o in &mut out {
        o[n_rows] = 12345.0;
    }
    let mut it = out.iter_mut();
    let outs: [&mut [f32]; TOKENS] = std::array::from_fn(|_| &mut it.next().unwrap()[..n_rows]);
    k.dot_rows_wide(w, rb, n_rows, &tile, GgmlPath::RepackGemm, outs);
    for (t, o) in out.iter().enumerate() {
        assert_eq!(o[n_rows], 12345.0, "{ty}: wrote past row {n_rows}");
        for (i, &got) in o[..n_rows].iter().enumerate() {
            let want = vec_dot_path(ty, &w[i * rb..(i + 1) * rb], &xs[t], GgmlPath::RepackGemm);
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
fn nibble_tiles_handle_the_repacked_gemm_only() {
    for ty in TYPES {
        assert!(handles(ty, GgmlPath::RepackGemm));
        for p in [GgmlPath::RepackGemv, GgmlPath::VecDot, GgmlPath::TinyBlasQ0] {
            assert!(!handles(ty, p), "{ty} {p:?}");
        }
    }
    assert!(!handles(GgmlType::Q8_0, GgmlPath::RepackGemm));
}

#[test]
fn nibble_tiles_give_the_scalar_bits_on_random_blocks() {
    let mut rng = Rng(0x4e1b_b1e5_0f0f);
    let mut n = 0;
    for ty in TYPES {
        let Some(k) = kernel(ty) else { return };
        for nb in [1, 2, 3, 18, 48] {
            // around the sixteen-row step: a short last step, exactly one step, one more row
            for n_rows in [1, 7, 15, 16, 17, 40] {
                let w: Vec<u8> = (0..n_rows)
                    .flat_map(|_| weight_row(ty, nb, &mut rng))
                    .collect();
                let nan = n_rows % 2 == 1;
                let xs: Vec<PreparedRow> = (0..TOKENS)
                    .map(|_| {
                        let x: Vec<f32> = (0..nb * 32).map(|_| rng.activation(97, nan)).collect();
                        prepared(ty, &x)
                    })
                    .collect();
                n += check(k, ty, &w, n_rows, &xs);
            }
        }
    }
    assert!(n > 10_000, "{n}");
}

#[test]
fn nibble_tiles_give_the_scalar_bits_at_the_integer_extremes() {
    for ty in TYPES {
        let Some(k) = kernel(ty) else { return };
        let nb = 3;
        let per = ty.type_size();
        // every nibble 0xF (Q4_0: 7, IQ4_NL: 113), 0x0 (−8, −127), 0x8 / 0x7 mixed
        let mut w = Vec::new();
        for fill in [0xFFu8, 0x00, 0x87, 0x78] {
            let mut r = vec![fill; nb * per];
            for blk in r.chunks_exact_mut(per) {
                blk[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
            w.extend(r);
        }
        let xs: Vec<PreparedRow> = (0..TOKENS)
            .map(|t| {
                let x: Vec<f32> = (0..nb * 32)
                    .map(|i| match t % 4 {
                        0 => -1.0,
                        1 => 1.0,
                        // a NaN quantizes to −128 (the block's other quants to 0)
                        2 if i % 32 == 3 => f32::NAN,
                        _ if i % 2 == 0 => 1.0,
                        _ => -0.25,
                    })
                    .collect();
                prepared(ty, &x)
            })
            .collect();
        assert!(xs[0].qs.iter().all(|&q| q == -127) && xs[1].qs.iter().all(|&q| q == 127));
        assert!(xs[2].has_min_quant && xs[2].qs.contains(&-128));
        check(k, ty, &w, 4, &xs);
    }
}

/// Whole matmuls of Q4_0 and IQ4_NL weights with SIMD off, AVX2 and AVX-512 (nibble tiles on the gemm
/// rows, the gemv rows of the last `B % 4` tokens, the last group of 8, single tokens; row counts that
/// are and are not repacked) give the same bits, NaN inputs included.
#[test]
fn matmul_with_nibble_tiles_gives_the_avx2_and_scalar_bits() {
    use crate::backend::{assert_matmul_same_bits_on_every_simd, QMatrix};
    if !Simd::Avx512.available() {
        eprintln!("skipping: this CPU has no AVX-512 VNNI");
        return;
    }
    let mut rng = Rng(0x51de_cafe_b0a7);
    for ty in TYPES {
        // 40 rows: repacked (a multiple of 8), 37: not (vec_dot / tinyBLAS)
        for (rows, cols) in [(40, 160), (37, 96), (72, 576)] {
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
            // one token: a decode step's eight-row gemv (`vpdpbusd` on AVX-512 unless a quant is −128)
            for (n_tokens, nan) in [
                (1, false),
                (1, true),
                (16, false),
                (35, false),
                (48, true),
                (57, true),
            ] {
                let x: Vec<f32> = (0..n_tokens * cols)
                    .map(|_| rng.activation(256, nan))
                    .collect();
                assert_matmul_same_bits_on_every_simd(
                    &m,
                    &x,
                    n_tokens,
                    &format!("{ty} {rows}x{cols}"),
                );
            }
        }
    }
}
