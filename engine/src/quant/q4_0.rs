//! Q4_0: 32 4-bit quants with an f16 scale; value = `(q - 8) * d`.
//!
//! `block_q4_0` (ggml-common.h, 18 bytes): `d: f16`, `qs: [u8; 16]`. Element `j < 16` is the low nibble of
//! `qs[j]`, element `j + 16` the high nibble. `vec_dot_type` Q8_0.

use super::fp::{c_f32_to_i8, f32_to_f16_ref, read_f16};
use super::q8::QK;
use super::x86::{fma, fma_lanes, hsum_float_8, sign_trick_mul};

/// Bytes per block.
pub(crate) const BYTES: usize = 18;

/// One block to f32 (`dequantize_row_q4_0`: `y = ((q & 0xF) - 8) * d`): the portable dequantizer (the
/// AVX2 one is `dequantize_simd.rs`'s `q4_0`). Under the mutation suite's
/// [`crate::faults::Fault::PortableDequantHalvesSwapped`] the two halves are swapped (high nibbles first).
#[inline(always)]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK]) {
    let d = read_f16(blk, 0);
    let qs = &blk[2..2 + QK / 2];
    let (lo, hi) = if crate::faults::is(crate::faults::Fault::PortableDequantHalvesSwapped) {
        (QK / 2, 0)
    } else {
        (0, QK / 2)
    };
    for j in 0..QK / 2 {
        out[j + lo] = (i32::from(qs[j] & 0x0F) - 8) as f32 * d;
        out[j + hi] = (i32::from(qs[j] >> 4) - 8) as f32 * d;
    }
}

/// `quantize_row_q4_0_ref` (ggml-quants.c): `max` = the first element of largest |x|, `d = max / -8`,
/// `id = d ? 1/d : 0`, `q = MIN(15, (int8_t)(x*id + 8.5f))` with separate multiply and add (libggml-base is
/// built without FMA).
pub(crate) fn quantize_row_ref(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BYTES)) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[0..2].copy_from_slice(&f32_to_f16_ref(d).to_le_bytes());
        let q = |v: f32| i32::from(c_f32_to_i8(v * id + 8.5)).min(15) as u8;
        for j in 0..QK / 2 {
            blk[2 + j] = q(x[j]) | (q(x[j + QK / 2]) << 4);
        }
    }
}

/// `ggml_vec_dot_q4_0_q8_0`, x86 AVX2 branch (arch/x86/quants.c; `tinyBLAS_Q0_AVX` gives the same per
/// output): per block `d = d_w * d_x`, eight i32 lanes over four consecutive elements of `(q - 8) * q8`
/// (`mul_sum_i8_pairs_float`), `acc[l] = fma(d, lane[l], acc[l])`; `hsum_float_8` at the end.
pub(crate) fn dot_q8_0<const SIGN_EXACT: bool>(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for ((blk, qy), &dy) in w.chunks_exact(BYTES).zip(xq.chunks_exact(QK)).zip(xd) {
        let d = read_f16(blk, 0) * dy;
        let qs = &blk[2..2 + QK / 2];
        let mut lanes = [0i32; 8];
        for l in 0..4 {
            for k in 4 * l..4 * l + 4 {
                let lo = i32::from(qs[k] & 0x0F) - 8;
                let hi = i32::from(qs[k] >> 4) - 8;
                if SIGN_EXACT {
                    lanes[l] += sign_trick_mul(lo, qy[k]);
                    lanes[l + 4] += sign_trick_mul(hi, qy[k + 16]);
                } else {
                    lanes[l] += lo * i32::from(qy[k]);
                    lanes[l + 4] += hi * i32::from(qy[k + 16]);
                }
            }
        }
        fma_lanes(d, &lanes, &mut acc);
    }
    hsum_float_8(&acc)
}

/// One output of llama.cpp's repacked Q4_0 matmul (`q4_0_8x8_q8_0`, ggml-cpu/arch/x86/repack.cpp), which
/// is what runs for Q4_0 weights with a row count divisible by 8 on an AVX2 or AVX-512 host (the default
/// `CPU_REPACK` buffer, `ggml_repack_get_optimal_repack_type`):
/// `gemv_q4_b32_8x8_q8_0_lut_avx` (decode, and the last `B % 4` rows of a batch) and
/// `gemm_q4_b32_8x8_q8_0_lut_avx` (batch rows in groups of 4; its AVX2 and AVX-512 branches agree per
/// output). Per block one exact integer dot of the 32 values `q - 8` with the activation quants, then
/// `acc = fma(isum, d_w·d_x, acc)` on a single accumulator, blocks in order; no lane split, no `hsum`.
///
/// `gemv = true` mirrors the gemv's `mul_sum_i8_pairs_acc_int32x8(weights, activations)`, whose `sign`
/// form wraps a −128 activation quant against a negative weight ([`sign_trick_mul`]); the gemm passes the
/// activation first and is exact there. A −128 quant only comes from a NaN input, so both agree otherwise.
/// The activation is `quantize_row_q8_0` (gemv) or `ggml_quantize_mat_q8_0_4x8` (gemm), which give the same
/// quants and scales.
pub(crate) fn dot_q8_0_repacked(w: &[u8], xq: &[i8], xd: &[f32], gemv: bool) -> f32 {
    dot_q8_0_repacked_lut(w, xq, xd, gemv, &VALUES)
}

/// The values of the 16 nibbles of a Q4_0 block as the file stores them: `q - 8`. (The repacked
/// `block_q4_0x8` stores `q ^ 8`, which is why `ggml_gemv_q4_0_8x8_q8_0`'s `signextendlut` reads
/// `0..7, -8..-1`: the same values.)
pub(crate) const VALUES: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];

/// [`dot_q8_0_repacked`] for any 4-bit format with Q4_0's block layout (`d: f16`, 16 bytes of nibbles) whose
/// nibble `i` stands for `values[i]`: `gemv_q4_b32_8x8_q8_0_lut_avx` / `gemm_q4_b32_8x8_q8_0_lut_avx` take
/// the table as their `signextendlut` (Q4_0: [`VALUES`] in nibble order `q - 8`; IQ4_NL: `kvalues_iq4nl`).
pub(crate) fn dot_q8_0_repacked_lut(
    w: &[u8],
    xq: &[i8],
    xd: &[f32],
    gemv: bool,
    values: &[i8; 16],
) -> f32 {
    let mut acc = 0f32;
    for ((blk, qy), &dy) in w.chunks_exact(BYTES).zip(xq.chunks_exact(QK)).zip(xd) {
        let d = read_f16(blk, 0) * dy;
        let qs = &blk[2..2 + QK / 2];
        let mut isum = 0i32;
        for k in 0..QK / 2 {
            let lo = i32::from(values[usize::from(qs[k] & 0x0F)]);
            let hi = i32::from(values[usize::from(qs[k] >> 4)]);
            if gemv {
                isum += sign_trick_mul(lo, qy[k]) + sign_trick_mul(hi, qy[k + QK / 2]);
            } else {
                isum += lo * i32::from(qy[k]) + hi * i32::from(qy[k + QK / 2]);
            }
        }
        acc = fma(isum as f32, d, acc);
    }
    acc
}
