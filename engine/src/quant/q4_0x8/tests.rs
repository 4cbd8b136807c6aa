//! The repacked Q4_0 copy and its AVX2 kernel against the scalar spec (`q4_0::dot_q8_0_repacked`, the
//! gemm's exact product), output by output: random blocks (f16 scales sometimes random bit patterns),
//! activations quantized by ggml mode's own `from_float` (NaN inputs give −128 quants, which the gemm
//! product takes exactly), the integer extremes, and every token count from one (decode) up.
use super::super::q4_0;
use super::super::test_rng::{blocks_with_f16_scale, ggml_prepared, same, Rng};
use super::super::{GgmlType, PreparedRow};
use super::{corrections, packable, repack, GROUP_BLOCK_BYTES, ROWS};

#[test]
fn the_copy_interleaves_eight_rows_as_block_q4_0x8() {
    let nb = 2;
    let rb = nb * q4_0::BYTES;
    // byte j of block ib of row r: a value naming all three
    let data: Vec<u8> = (0..16 * rb)
        .map(|i| {
            let (r, off) = (i / rb, i % rb);
            (r * 40 + off) as u8
        })
        .collect();
    let p = repack(&data, 16, rb);
    assert_eq!(p.len(), data.len());
    for g in 0..2 {
        for ib in 0..nb {
            let blk = &p[(g * nb + ib) * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
            for r in 0..ROWS {
                let src = &data[(8 * g + r) * rb + ib * q4_0::BYTES..][..q4_0::BYTES];
                assert_eq!(&blk[2 * r..2 * r + 2], &src[..2], "d of row {r}");
                // chunk k = bytes 8·(k / 8) .. of row k % 8
                assert_eq!(&blk[16 + 8 * r..16 + 8 * r + 8], &src[2..10]);
                assert_eq!(&blk[16 + 8 * (8 + r)..16 + 8 * (8 + r) + 8], &src[10..18]);
            }
        }
    }
    assert!(packable(8, 18) && packable(576, 18 * 18));
    assert!(!packable(12, 18) && !packable(0, 18) && !packable(8, 20));
}

/// Every output of the kernel on `w` (`n_rows` rows) and `xs` against the scalar gemm spec.
#[cfg(target_arch = "x86_64")]
fn check(w: &[u8], n_rows: usize, xs: &[PreparedRow]) -> usize {
    let rb = w.len() / n_rows;
    let nb = rb / q4_0::BYTES;
    let packed = repack(w, n_rows, rb);
    let corr: Vec<Vec<i32>> = xs
        .iter()
        .map(|x| {
            let mut c = vec![0; nb];
            corrections(&x.qs, nb, &mut c);
            c
        })
        .collect();
    let acts: Vec<super::Act<'_>> = xs
        .iter()
        .zip(&corr)
        .map(|(x, c)| super::Act {
            qs: &x.qs,
            d: &x.d,
            corr: c,
        })
        .collect();
    let mut n = 0;
    for vnni in [false, true] {
        if vnni && !crate::numerics::avx512_available() {
            continue;
        }
        let mut out = vec![vec![f32::NAN; n_rows]; xs.len()];
        let mut acc = Vec::new();
        let ptrs: Vec<*mut f32> = out.iter_mut().map(|o| o.as_mut_ptr()).collect();
        let o = |t: usize| {
            // SAFETY: each token's output is handed out once per group, and the kernel writes only its
            // group's eight floats of it before asking for the next
            unsafe { std::slice::from_raw_parts_mut(ptrs[t], n_rows) }
        };
        // SAFETY: AVX2 is checked by the caller, AVX-512 VNNI just above
        unsafe {
            if vnni {
                super::gemm_vnni(&packed, nb, &acts, &mut acc, o)
            } else {
                super::gemm(&packed, nb, &acts, &mut acc, o)
            }
        };
        for (t, o) in out.iter().enumerate() {
            for (i, &got) in o.iter().enumerate() {
                let want =
                    q4_0::dot_q8_0_repacked(&w[i * rb..(i + 1) * rb], &xs[t].qs, &xs[t].d, false);
                assert!(
                    same(got, want),
                    "nb {nb} row {i} token {t} vnni {vnni}: packed {got:e} vs scalar {want:e}"
                );
            }
        }
        n += n_rows * xs.len();
    }
    n
}

/// The kernels this CPU runs: AVX2, and AVX-512 VNNI where it has it.
#[cfg(target_arch = "x86_64")]
fn kernels() -> usize {
    if crate::numerics::avx512_available() {
        2
    } else {
        1
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_packed_kernel_gives_the_scalar_bits_on_random_blocks() {
    if !crate::numerics::avx2_available() {
        eprintln!("skipping: no AVX2 on this CPU");
        return;
    }
    let mut rng = Rng(0x9a7c_4e11_0c0d);
    let mut n = 0;
    for nb in [1, 2, 3, 18, 48] {
        for n_rows in [8, 16, 40] {
            for n_tok in [1, 2, 5, 16] {
                let w = blocks_with_f16_scale(GgmlType::Q4_0, n_rows * nb, 1e-4, &mut rng);
                let nan = n_tok % 2 == 1;
                let xs: Vec<PreparedRow> = (0..n_tok)
                    .map(|_| {
                        let x: Vec<f32> = (0..nb * 32).map(|_| rng.activation(97, nan)).collect();
                        ggml_prepared(GgmlType::Q4_0, &x)
                    })
                    .collect();
                n += check(&w, n_rows, &xs);
            }
        }
    }
    // 5 block counts × 64 rows × 24 tokens, once per kernel this CPU runs
    assert_eq!(n, 7680 * kernels());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_packed_kernel_gives_the_scalar_bits_at_the_integer_extremes() {
    if !crate::numerics::avx2_available() {
        eprintln!("skipping: no AVX2 on this CPU");
        return;
    }
    let nb = 3;
    let per = q4_0::BYTES;
    // every nibble 0xF (7), 0x0 (−8), 0x8 / 0x7 mixed; two of each for a group of eight
    let mut w = Vec::new();
    for fill in [0xFFu8, 0x00, 0x87, 0x78, 0xFF, 0x00, 0x87, 0x78] {
        let mut r = vec![fill; nb * per];
        for blk in r.chunks_exact_mut(per) {
            blk[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
        w.extend(r);
    }
    let xs: Vec<PreparedRow> = (0..8)
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
            ggml_prepared(GgmlType::Q4_0, &x)
        })
        .collect();
    assert!(xs[0].qs.iter().all(|&q| q == -127) && xs[1].qs.iter().all(|&q| q == 127));
    assert!(xs[2].qs.contains(&-128));
    assert_eq!(check(&w, 8, &xs), 64 * kernels());
}

/// Whole ggml-mode matmuls of a Q4_0 matrix with a place for its repacked copy: SIMD off (the scalar
/// kernels, no copy), AVX2 and AVX-512 (the copy, made on first use) give the same bits — decode steps,
/// batches on the gemm and the gemv, NaN inputs (a −128 quant sends a gemv token back to the other
/// kernels) — on one and two workers; a row count not a multiple of 8 gets no copy.
#[test]
fn matmul_through_the_repacked_copy_gives_the_scalar_bits() {
    use crate::backend::{assert_matmul_same_bits_on_every_simd, QMatrix};
    if !crate::numerics::avx2_available() {
        eprintln!("skipping: no AVX2 on this CPU");
        return;
    }
    let mut rng = Rng(0x7e57_0fa1_c0de);
    for (rows, cols) in [(40, 160), (72, 576), (37, 96)] {
        let w = blocks_with_f16_scale(GgmlType::Q4_0, rows * cols / 32, 1e-4, &mut rng);
        let cell = std::sync::OnceLock::new();
        let m = QMatrix {
            ty: GgmlType::Q4_0,
            rows,
            cols,
            data: &w,
            repacked: Some(&cell),
        };
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for (n_tokens, nan) in [(1, false), (1, true), (5, false), (16, true), (35, false)] {
                let x: Vec<f32> = (0..n_tokens * cols)
                    .map(|_| rng.activation(256, nan))
                    .collect();
                pool.install(|| {
                    assert_matmul_same_bits_on_every_simd(
                        &m,
                        &x,
                        n_tokens,
                        &format!("Q4_0 {rows}x{cols} {threads} threads"),
                    )
                });
            }
        }
        assert_eq!(
            cell.get().map(Vec::len),
            (rows % 8 == 0).then_some(w.len()),
            "{rows} rows: a copy exactly when the rows are a multiple of 8"
        );
    }
}
