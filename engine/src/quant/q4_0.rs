//! Q4_0: 32 4-bit quants with an f16 scale; value = `(q - 8) * d`.
//!
//! `block_q4_0` (ggml-common.h, 18 bytes): `d: f16`, `qs: [u8; 16]`. Element `j < 16` is the low nibble of
//! `qs[j]`, element `j + 16` the high nibble. `vec_dot_type` Q8_0.

use super::fp::{c_f32_to_i8, f32_to_f16_ref, read_f16};
use super::q8::QK;
use super::x86::{fma_lanes, hsum_float_8, sign_trick_mul};

/// Bytes per block.
pub(crate) const BYTES: usize = 18;

/// One block to f32 (`dequantize_row_q4_0`: `y = ((q & 0xF) - 8) * d`).
#[inline]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK]) {
    let d = read_f16(blk, 0);
    let qs = &blk[2..2 + QK / 2];
    for j in 0..QK / 2 {
        out[j] = (i32::from(qs[j] & 0x0F) - 8) as f32 * d;
        out[j + QK / 2] = (i32::from(qs[j] >> 4) - 8) as f32 * d;
    }
}

/// `quantize_row_q4_0_ref` (ggml-quants.c): `max` = the first element of largest |x|, `d = max / -8`,
/// `id = d ? 1/d : 0`, `q = MIN(15, (int8_t)(x*id + 8.5f))` with separate multiply and add (libggml-base is
/// built without FMA).
pub(crate) fn quantize_ref(src: &[f32], dst: &mut [u8]) {
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
