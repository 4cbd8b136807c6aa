//! Q5_0: 32 5-bit quants with an f16 scale; value = `(q - 16) * d`.
//!
//! `block_q5_0` (ggml-common.h, 22 bytes): `d: f16`, `qh: [u8; 4]` (bit `j` of the little-endian u32 is the
//! fifth bit of element `j`), `qs: [u8; 16]` (low nibbles: element `j < 16` in the low half of `qs[j]`,
//! `j + 16` in the high half). `vec_dot_type` Q8_0.

use super::fp::{c_f32_to_i8, f32_to_f16_ref, read_f16};
use super::q8::QK;
use super::x86::{fma_lanes, hsum_float_8, sign_trick_mul};

/// Bytes per block.
pub(crate) const BYTES: usize = 22;

/// The 32 signed values `q - 16` of one block, in element order.
#[inline(always)]
fn values(blk: &[u8]) -> [i32; QK] {
    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
    let qs = &blk[6..6 + QK / 2];
    let mut v = [0i32; QK];
    for j in 0..QK / 2 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        v[j] = (u32::from(qs[j] & 0x0F) | h0) as i32 - 16;
        v[j + QK / 2] = (u32::from(qs[j] >> 4) | h1) as i32 - 16;
    }
    v
}

/// One block to f32 (`dequantize_row_q5_0`: `y = (q - 16) * d`).
#[inline(always)]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK]) {
    let d = read_f16(blk, 0);
    for (o, v) in out.iter_mut().zip(values(blk)) {
        *o = v as f32 * d;
    }
}

/// `quantize_row_q5_0_ref` (ggml-quants.c): like Q4_0 with `d = max / -16`,
/// `q = MIN(31, (int8_t)(x*id + 16.5f))`, fifth bits gathered into `qh`.
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
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[0..2].copy_from_slice(&f32_to_f16_ref(d).to_le_bytes());
        let q = |v: f32| i32::from(c_f32_to_i8(v * id + 16.5)).min(31) as u8;
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let (x0, x1) = (q(x[j]), q(x[j + QK / 2]));
            blk[6 + j] = (x0 & 0x0F) | ((x1 & 0x0F) << 4);
            qh |= u32::from((x0 & 0x10) >> 4) << j;
            qh |= u32::from((x1 & 0x10) >> 4) << (j + QK / 2);
        }
        blk[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

/// `ggml_vec_dot_q5_0_q8_0`, x86 AVX2 branch (arch/x86/quants.c; `tinyBLAS_Q0_AVX` gives the same per
/// output): like Q4_0 with values `q - 16` (`mul_sum_i8_pairs_float`, sign trick), eight fma lanes,
/// `hsum_float_8`.
pub(crate) fn dot_q8_0<const SIGN_EXACT: bool>(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for ((blk, qy), &dy) in w.chunks_exact(BYTES).zip(xq.chunks_exact(QK)).zip(xd) {
        let d = read_f16(blk, 0) * dy;
        let v = values(blk);
        let mut lanes = [0i32; 8];
        for (l, lane) in lanes.iter_mut().enumerate() {
            for k in 4 * l..4 * l + 4 {
                *lane += if SIGN_EXACT {
                    sign_trick_mul(v[k], qy[k])
                } else {
                    v[k] * i32::from(qy[k])
                };
            }
        }
        fma_lanes(d, &lanes, &mut acc);
    }
    hsum_float_8(&acc)
}
