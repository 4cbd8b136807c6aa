//! Q5_1: 32 5-bit quants with an f16 scale and an f16 minimum; value = `q * d + m`.
//!
//! `block_q5_1` (ggml-common.h, 24 bytes): `d: f16`, `m: f16`, `qh: [u8; 4]` (bit `j` of the little-endian
//! u32 is the fifth bit of element `j`), `qs: [u8; 16]` (element `j < 16` in the low nibble of `qs[j]`,
//! `j + 16` in the high nibble). `vec_dot_type` Q8_1, as Q4_1: the min term needs the activation block's
//! pre-scaled sum `s = d8 * sum(q8)`.

use super::fp::{c_f32_to_i32, f32_to_f16_ref, read_f16};
use super::q8::QK;
use super::x86::{fma, fma_lanes, hsum_float_8};

/// Bytes per block.
pub(crate) const BYTES: usize = 24;

/// The 32 unsigned 5-bit quants (0..32) of one block, in element order.
#[inline]
fn quants(blk: &[u8]) -> [u8; QK] {
    let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
    let qs = &blk[8..8 + QK / 2];
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        q[j] = (qs[j] & 0x0F) | h0 as u8;
        q[j + QK / 2] = (qs[j] >> 4) | h1 as u8;
    }
    q
}

/// One block to f32 (`dequantize_row_q5_1`, ggml-quants.c: `y = q * d + m`, multiply then add).
#[inline(always)]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK]) {
    let d = read_f16(blk, 0);
    let m = read_f16(blk, 2);
    for (o, q) in out.iter_mut().zip(quants(blk)) {
        *o = f32::from(q) * d + m;
    }
}

/// `quantize_row_q5_1_ref` (ggml-quants.c), which `quantize_q5_1` runs without an importance matrix:
/// per 32-block `min`/`max` by `<`/`>` in element order (starting from `FLT_MAX`/`-FLT_MAX`),
/// `d = (max - min) / 31`, `id = d ? 1/d : 0`, `q = (uint8_t)((x - min)*id + 0.5f)` — subtract, multiply,
/// add as three roundings (libggml-base is compiled without `-march`, so gcc has no FMA to contract into),
/// the cast as gcc does it (`cvttss2si`, low byte), no clamp — then the low nibbles into `qs` and the fifth
/// bits into `qh`.
///
/// `src.len()` is a multiple of 32 and `dst` holds `src.len() / 32` blocks of [`BYTES`] (the caller's
/// contract; extra input or output is left alone).
pub(crate) fn quantize_row_ref(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BYTES)) {
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[0..2].copy_from_slice(&f32_to_f16_ref(d).to_le_bytes());
        blk[2..4].copy_from_slice(&f32_to_f16_ref(min).to_le_bytes());
        let q = |v: f32| c_f32_to_i32((v - min) * id + 0.5) as u8;
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let (x0, x1) = (q(x[j]), q(x[j + QK / 2]));
            blk[8 + j] = (x0 & 0x0F) | ((x1 & 0x0F) << 4);
            qh |= u32::from((x0 & 0x10) >> 4) << j;
            qh |= u32::from((x1 & 0x10) >> 4) << (j + QK / 2);
        }
        blk[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

/// `ggml_vec_dot_q5_1_q8_1`, x86 AVX2 branch (arch/x86/quants.c; no tinyBLAS, tiled or repack path exists
/// for Q5_1, so every Q5_1 matmul on this machine runs it). The Q4_1 kernel with 5-bit quants: per block
/// `summs = fma(m_w, s_x, summs)` (gcc contracts `summs += m*s`), `d = d_w * d_x`, eight i32 lanes of
/// `q5 * q8` over four consecutive elements (`mul_sum_us8_pairs_float`: unsigned quants, `vpdpbusd`,
/// exact), `acc[l] = fma(d, lane[l], acc[l])`. Result `hsum_float_8(acc) + summs`.
pub(crate) fn dot_q8_1(w: &[u8], xq: &[i8], xd: &[f32], xs: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (((blk, qy), &dy), &sy) in w
        .chunks_exact(BYTES)
        .zip(xq.chunks_exact(QK))
        .zip(xd)
        .zip(xs)
    {
        summs = fma(read_f16(blk, 2), sy, summs);
        let d = read_f16(blk, 0) * dy;
        let q = quants(blk);
        let mut lanes = [0i32; 8];
        for (l, lane) in lanes.iter_mut().enumerate() {
            for k in 4 * l..4 * l + 4 {
                *lane += i32::from(q[k]) * i32::from(qy[k]);
            }
        }
        fma_lanes(d, &lanes, &mut acc);
    }
    hsum_float_8(&acc) + summs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantizes_a_hand_made_block() {
        // d = 0.5, m = -2; element j has quant j (fifth bit set for j >= 16)
        let mut blk = [0u8; BYTES];
        blk[0..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        blk[2..4].copy_from_slice(&half::f16::from_f32(-2.0).to_le_bytes());
        let mut qh = 0u32;
        for j in 0..32u32 {
            if j & 0x10 != 0 {
                qh |= 1 << j;
            }
        }
        blk[4..8].copy_from_slice(&qh.to_le_bytes());
        for j in 0..16 {
            blk[8 + j] = (j as u8) | (((j as u8 + 16) & 0x0F) << 4);
        }
        let mut out = [0f32; QK];
        dequantize_block(&blk, &mut out);
        for (j, &v) in out.iter().enumerate() {
            assert_eq!(v, j as f32 * 0.5 - 2.0, "element {j}");
        }
    }
}
