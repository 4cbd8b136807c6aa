//! IQ4_XS: super-blocks of 256 = 8 sub-blocks of 32 4-bit indices into `kvalues_iq4nl`, each with a 6-bit
//! scale; value = `d * (ls - 32) * kvalues_iq4nl[q]`.
//!
//! `block_iq4_xs` (ggml-common.h, 136 bytes): `d: f16`, `scales_h: u16` (bits `2s..2s+2`: high bits of
//! sub-block `s`'s scale), `scales_l: [u8; 4]` (low nibbles: sub-block `s` in nibble `s % 2` of
//! `scales_l[s / 2]`), `qs: [u8; 128]` (sub-block `s` in `qs[16s..16s+16]`, low nibbles first, as IQ4_NL).
//! `vec_dot_type` Q8_K.

use super::fp::{read_f16, read_u16};
use super::iq4_nl;
use super::q8_k::QK_K;
use super::x86::{fma, fma_lanes, hsum_float_8, sign_trick_mul};

/// Bytes per block.
pub(crate) const BYTES: usize = 136;

/// The eight sub-block scales minus 32 (`ls - 32`, `-32..32`), as `dequantize_row_iq4_xs` extracts them.
#[inline]
pub(super) fn scales(blk: &[u8]) -> [i32; 8] {
    let sh = u32::from(read_u16(blk, 2));
    core::array::from_fn(|s| {
        let lo = u32::from(blk[4 + s / 2] >> (4 * (s % 2))) & 0xF;
        ((lo | (((sh >> (2 * s)) & 3) << 4)) as i32) - 32
    })
}

/// One block to f32 (`dequantize_row_iq4_xs`, ggml-quants.c: `dl = d * (ls - 32)`,
/// `y = dl * kvalues_iq4nl[q]`).
#[inline(always)]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK_K]) {
    let d = read_f16(blk, 0);
    let ls = scales(blk);
    for (s, y) in out.chunks_exact_mut(32).enumerate() {
        let dl = d * ls[s] as f32;
        for (y, v) in y
            .iter_mut()
            .zip(iq4_nl::values(&blk[8 + 16 * s..8 + 16 * s + 16]))
        {
            *y = dl * v as f32;
        }
    }
}

/// `ggml_vec_dot_iq4_xs_q8_K`, x86 AVX2 branch (arch/x86/quants.c). Per super-block: eight i32 lanes
/// `lane[l] = Σ_s (ls[s] − 32) · Σ_{e<4} v[32s+4l+e] ⊙ q8[32s+4l+e]` with the table values `v` and the
/// `mul_add_epi8` product `⊙` (`_mm256_sign_epi8` trick: [`sign_trick_mul`], equal to `v * q8` unless a
/// quant is −128), `madd` with the scale (exact); `acc[l] = fma(d_w * d8, lane[l], acc[l])`. Result
/// `hsum_float_8(acc)`.
pub(crate) fn dot_q8_k(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for ((blk, qy), &dy) in w.chunks_exact(BYTES).zip(xq.chunks_exact(QK_K)).zip(xd) {
        let ls = scales(blk);
        let mut lanes = [0i32; 8];
        for (s, &sc) in ls.iter().enumerate() {
            let v = iq4_nl::values(&blk[8 + 16 * s..8 + 16 * s + 16]);
            let y = &qy[32 * s..32 * s + 32];
            for (l, lane) in lanes.iter_mut().enumerate() {
                let mut p = 0i32;
                for e in 4 * l..4 * l + 4 {
                    p += sign_trick_mul(v[e], y[e]);
                }
                *lane = lane.wrapping_add(sc * p);
            }
        }
        fma_lanes(read_f16(blk, 0) * dy, &lanes, &mut acc);
    }
    hsum_float_8(&acc)
}

/// One output of llama.cpp's tiled K-quant matmul for IQ4_XS (ggml-cpu/tiled,
/// `tiled_run_microtile<32, false, 128>`: codes `v + 128` with the bias taken out through the Q8_K sums),
/// batches ≥ 8: per super-block the exact integer `s1 = Σ_s (ls[s] − 32) · Σ v·q8`, then `res = d_w·s1`,
/// `acc = fma(res, d_x, acc)`. This machine runs the AVX-512 VNNI kernel (`vpdpbusd` of the biased codes:
/// plain products); the AVX2 kernel would use the sign trick instead, which differs only for a −128
/// activation quant (a NaN input).
pub(crate) fn dot_q8_k_tiled(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let mut acc = 0f32;
    for ((blk, qy), &dy) in w.chunks_exact(BYTES).zip(xq.chunks_exact(QK_K)).zip(xd) {
        let ls = scales(blk);
        let mut s1 = 0i32;
        for (s, &sc) in ls.iter().enumerate() {
            let v = iq4_nl::values(&blk[8 + 16 * s..8 + 16 * s + 16]);
            let dot: i32 = v
                .iter()
                .zip(&qy[32 * s..32 * s + 32])
                .map(|(&v, &y)| v * i32::from(y))
                .sum();
            s1 = s1.wrapping_add(sc * dot);
        }
        acc = fma(read_f16(blk, 0) * s1 as f32, dy, acc);
    }
    acc
}

/// IQ4_XS without an importance matrix: `quantize_iq4_xs(src, dst, 1, n, NULL)` (ggml-quants.c; also
/// `quantize_row_iq4_xs_ref`), i.e. per super-block [`iq4_nl::quantize_row_iq4_nl_impl`]`(256, 32, …,
/// kvalues_iq4nl, NULL, ntry 7)`. `src`: `n·256` f32; `dst`: `n·136` bytes (`block_iq4_xs`). Plain f32
/// arithmetic: libggml-base is compiled without FMA (see `kquant_ref`).
pub(crate) fn quantize_row_ref(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BYTES)) {
        let mut dh = 0u16;
        let mut sh = [0u16; 1];
        let mut sl = [0u8; 4];
        iq4_nl::quantize_row_iq4_nl_impl(
            QK_K,
            32,
            x,
            &mut dh,
            &mut blk[8..BYTES],
            &mut sh,
            &mut sl,
            &iq4_nl::KVALUES,
            None,
            7,
        );
        blk[0..2].copy_from_slice(&dh.to_le_bytes());
        blk[2..4].copy_from_slice(&sh[0].to_le_bytes());
        blk[4..8].copy_from_slice(&sl);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantizes_a_hand_made_block() {
        // d = 0.125; sub-block s has ls = 8s + 3 (low nibble in scales_l, high 2 bits in scales_h);
        // element 32s + j has index (j + s) % 16
        let mut blk = [0u8; BYTES];
        blk[0..2].copy_from_slice(&half::f16::from_f32(0.125).to_le_bytes());
        let mut sh = 0u16;
        for s in 0..8 {
            let ls = 8 * s as u8 + 3;
            blk[4 + s / 2] |= (ls & 0xF) << (4 * (s % 2));
            sh |= u16::from(ls >> 4) << (2 * s);
        }
        blk[2..4].copy_from_slice(&sh.to_le_bytes());
        for s in 0..8 {
            for j in 0..16 {
                let lo = ((j + s) % 16) as u8;
                let hi = ((j + 16 + s) % 16) as u8;
                blk[8 + 16 * s + j] = lo | (hi << 4);
            }
        }
        let mut out = [0f32; QK_K];
        dequantize_block(&blk, &mut out);
        for (i, &v) in out.iter().enumerate() {
            let (s, j) = (i / 32, i % 32);
            let dl = 0.125 * (8 * s as i32 + 3 - 32) as f32;
            let want = dl * f32::from(iq4_nl::KVALUES[(j + s) % 16]);
            assert_eq!(v, want, "element {i}");
        }
    }
}

#[cfg(test)]
mod quantize_tests {
    use super::super::kquant_ref::test_rows::{check_golden, check_round_trip};
    use super::*;

    #[test]
    fn quantize_row_ref_matches_ggml_bytes() {
        // sha256 of the bytes ggml produces for `test_rows::rows()`: the C oracle (dev-only, outside the
        // repo) is ggml-quants.c of the pinned llama.cpp 0c1e570 compiled as libggml-base compiles it,
        // `gcc-12 -O3 -DNDEBUG -std=gnu11 -fPIC -D_GNU_SOURCE -D_XOPEN_SOURCE=600 -DGGML_SCHED_MAX_COPIES=4
        // -Iggml/include -Iggml/src -Iggml/src/ggml-cpu -c ggml-quants.c`, linked with a small driver that
        // calls `quantize_iq4_xs(rows, dst, 1, n_per_row, NULL)` on the rows `dump_for_oracle` writes.
        // The ggml-quants.c.o of the llama.cpp tools build (its libggml-base.a) gives the same bytes.
        let expected = [
            (
                "constant",
                "fcfcb250ecd724572b3405188575b16dd9c488d0d741e032359fa1ab66106ba2",
            ),
            (
                "huge_in_noise",
                "02ab31e5801fb8b41670e972faa14f844cb6ee5403030b144fbb5f281e3963e9",
            ),
            (
                "mixed_groups",
                "b9ad3d32ed90d5d06f49b619cf82b72d15ce45d0bb2744ce47743418c9b1165a",
            ),
            (
                "neg_constant",
                "15b1f65cd2658fa2151993e7804ac3522379fb7990eade21f9ec1af7914cc3f7",
            ),
            (
                "normal_0.02",
                "6ffa19b2ece7c5f4266d8f07e55c98a7001acbc0e446f0d9197c7c6edd729dd8",
            ),
            (
                "normal_1",
                "9220d8b6571155cb8d98b39b6e91daca861b9941b6d99045dfbdf9dd10f47be2",
            ),
            (
                "one_huge",
                "3bfdb38883ff7c8673e5c68ec3a2583c7ecc1f369c916b51b94590a4b358fed1",
            ),
            (
                "outliers",
                "532faa834ad708a3abf72806de5ec0fb390d2281a9ef3a53a1db04d39f8e4332",
            ),
            (
                "sparse",
                "db617ccd3237ed609d2f5fba4bcdb62f7a53b7f3123e068a17682d946fc70669",
            ),
            (
                "sweep_concat",
                "a8dcda63a9471a765a52be014f14f485c62ffabd7ad265001b5987876f7e0cb8",
            ),
            (
                "tiny",
                "d31d355bc7a06c1fa6e5f49da4a2cd5c2e11f9d3a5b6f29292ff0eaaf99ce0a8",
            ),
            (
                "uniform_pos",
                "d7adc1f010e00dc12ca12cbe8f6678efc9642afaa534c01c6d078ced81994a65",
            ),
            (
                "zeros",
                "b2f53f1655f92b743085c9dc8a4dae40c832d9e294347ea5ee0d91053c8026fa",
            ),
        ];
        check_golden("iq4_xs", quantize_row_ref, BYTES, &expected);
    }

    #[test]
    fn quantize_row_ref_round_trips() {
        // ggml's own output has a worst relative RMS error of 0.135 on these rows (bytes are identical)
        check_round_trip("iq4_xs", quantize_row_ref, BYTES, dequantize_block, 0.17);
    }
}
