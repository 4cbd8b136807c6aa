//! The repacked IQ4_NL copy and its kernels against the scalar spec (`q4_0::dot_q8_0_repacked_lut` with
//! `iq4_nl::KVALUES`, the gemm's exact product; the gemv's where no quant is −128), output by output:
//! random blocks (f16 scales sometimes random bit patterns), activations quantized by ggml mode's own
//! `from_float` (NaN inputs give −128 quants), the table's extremes, ragged row and token counts.
use super::super::iq4_nl::{self, KVALUES};
use super::super::q4_0::dot_q8_0_repacked_lut;
use super::super::q4_0x8::{packable, repack, Act, GROUP_BLOCK_BYTES, ROWS};
use super::super::test_rng::{blocks_with_f16_scale, ggml_prepared, same, Rng};
use super::super::{GgmlType, PreparedRow};
use super::corrections;

#[test]
fn the_copy_interleaves_eight_rows_as_block_iq4_nlx8() {
    // make_block_iq4_nlx8: out.d[i] = in[i].d; out.qs[i] = in[src_id].qs[src_offset ..] for i < 16
    // (chunks of 8 bytes), src_id = i % 8, src_offset = (i / 8) · 8 — no xor
    let nb = 3;
    let rb = nb * iq4_nl::BYTES;
    let data: Vec<u8> = (0..24 * rb)
        .map(|i| ((i / rb) * 37 + (i % rb) * 5) as u8)
        .collect();
    let p = repack(&data, 24, rb);
    assert_eq!(p.len(), data.len());
    for g in 0..3 {
        for ib in 0..nb {
            let blk = &p[(g * nb + ib) * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
            for i in 0..ROWS {
                let src = &data[(8 * g + i) * rb + ib * iq4_nl::BYTES..][..iq4_nl::BYTES];
                assert_eq!(&blk[2 * i..2 * i + 2], &src[..2], "d of row {i}");
            }
            for i in 0..16 {
                let (src_id, src_offset) = (i % 8, (i / 8) * 8);
                let src = &data[(8 * g + src_id) * rb + ib * iq4_nl::BYTES + 2..][..16];
                assert_eq!(
                    &blk[16 + 8 * i..16 + 8 * i + 8],
                    &src[src_offset..src_offset + 8],
                    "group {g} block {ib} chunk {i}"
                );
            }
        }
    }
    assert!(packable(8, 18) && packable(576, 18 * 18));
    assert!(!packable(12, 18) && !packable(0, 18));
}

#[test]
fn corrections_are_minus_128_times_each_blocks_sum() {
    let qs: Vec<i8> = (0..64).map(|i| (i * 7 % 256 - 128) as i8).collect();
    let mut c = [0; 2];
    corrections(&qs, 2, &mut c);
    for (b, &c) in c.iter().enumerate() {
        let s: i32 = qs[32 * b..32 * b + 32].iter().map(|&v| i32::from(v)).sum();
        assert_eq!(c, -128 * s);
    }
}

/// Every output of the kernels on `w` (`n_rows` rows) and `xs` against the scalar gemm spec, and the
/// gemv spec for tokens without a −128 quant. Returns the outputs checked.
#[cfg(target_arch = "x86_64")]
fn check(w: &[u8], n_rows: usize, xs: &[PreparedRow]) -> usize {
    let rb = w.len() / n_rows;
    let nb = rb / iq4_nl::BYTES;
    let packed = repack(w, n_rows, rb);
    let corr: Vec<Vec<i32>> = xs
        .iter()
        .map(|x| {
            let mut c = vec![0; nb];
            corrections(&x.qs, nb, &mut c);
            c
        })
        .collect();
    let acts: Vec<Act<'_>> = xs
        .iter()
        .zip(&corr)
        .map(|(x, c)| Act {
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
            let x = &xs[t];
            for (i, &got) in o.iter().enumerate() {
                let row = &w[i * rb..(i + 1) * rb];
                let want = dot_q8_0_repacked_lut(row, &x.qs, &x.d, false, &KVALUES);
                assert!(
                    same(got, want),
                    "nb {nb} row {i} token {t} vnni {vnni}: packed {got:e} vs scalar {want:e}"
                );
                if !x.has_min_quant {
                    let gemv = dot_q8_0_repacked_lut(row, &x.qs, &x.d, true, &KVALUES);
                    assert!(same(got, gemv), "gemv spec, row {i} token {t}");
                }
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
    let mut rng = Rng(0x1a4_0d1e_77ab);
    let mut n = 0;
    let mut min_quants = 0;
    for nb in [1, 2, 3, 18, 48] {
        for n_rows in [8, 16, 40] {
            for n_tok in [1, 2, 5, 16] {
                let w = blocks_with_f16_scale(GgmlType::IQ4_NL, n_rows * nb, 1e-4, &mut rng);
                let nan = n_tok % 2 == 1;
                let xs: Vec<PreparedRow> = (0..n_tok)
                    .map(|_| {
                        let x: Vec<f32> = (0..nb * 32).map(|_| rng.activation(97, nan)).collect();
                        ggml_prepared(GgmlType::IQ4_NL, &x)
                    })
                    .collect();
                min_quants += xs.iter().filter(|x| x.has_min_quant).count();
                n += check(&w, n_rows, &xs);
            }
        }
    }
    assert!(min_quants > 0, "some tokens carry a −128 quant");
    // 5 block counts × 64 rows × 24 tokens, once per kernel this CPU runs
    assert_eq!(n, 7680 * kernels());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_packed_kernel_gives_the_scalar_bits_at_the_table_extremes() {
    if !crate::numerics::avx2_available() {
        eprintln!("skipping: no AVX2 on this CPU");
        return;
    }
    let nb = 3;
    let per = iq4_nl::BYTES;
    // every nibble 0 (−127), 15 (113), 0 / 15 mixed, 7 / 8 (−10 / 1); two of each for a group of eight
    let mut w = Vec::new();
    for fill in [0x00u8, 0xFF, 0xF0, 0x0F, 0x00, 0xFF, 0x78, 0x87] {
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
                    2 => -1.0,
                    _ if i % 2 == 0 => 1.0,
                    _ => -0.25,
                })
                .collect();
            ggml_prepared(GgmlType::IQ4_NL, &x)
        })
        .collect();
    assert!(xs[0].qs.iter().all(|&q| q == -127) && xs[1].qs.iter().all(|&q| q == 127));
    assert!(xs[2].qs.contains(&-128) && xs[2].has_min_quant);
    // the −128 quant against −127 values: the gemv's sign form would wrap, the gemm's is exact
    let row0 = &w[..nb * per];
    assert_ne!(
        dot_q8_0_repacked_lut(row0, &xs[2].qs, &xs[2].d, true, &KVALUES).to_bits(),
        dot_q8_0_repacked_lut(row0, &xs[2].qs, &xs[2].d, false, &KVALUES).to_bits()
    );
    assert_eq!(check(&w, 8, &xs), 64 * kernels());
}

/// Whole ggml-mode matmuls of an IQ4_NL matrix with a place for its repacked copy: SIMD off (the
/// scalar kernels, no copy), AVX2 and AVX-512 give the same bits — decode steps, batches on the gemm and
/// the gemv, NaN inputs (a −128 quant sends a gemv token back to the other kernels) — on one and two
/// workers; a row count not a multiple of 8 gets no copy.
#[test]
fn matmul_through_the_repacked_copy_gives_the_scalar_bits() {
    use crate::backend::{assert_matmul_same_bits_on_every_simd, QMatrix};
    if !crate::numerics::avx2_available() {
        eprintln!("skipping: no AVX2 on this CPU");
        return;
    }
    let mut rng = Rng(0x1a4_7e57_c0de);
    for (rows, cols) in [(40, 160), (72, 576), (37, 96)] {
        let w = blocks_with_f16_scale(GgmlType::IQ4_NL, rows * cols / 32, 1e-4, &mut rng);
        let cell = std::sync::OnceLock::new();
        let m = QMatrix {
            ty: GgmlType::IQ4_NL,
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
                        &format!("IQ4_NL {rows}x{cols} {threads} threads"),
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
