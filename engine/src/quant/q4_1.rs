//! Q4_1: 32 4-bit quants with an f16 scale and an f16 minimum; value = `q * d + m`.
//!
//! `block_q4_1` (ggml-common.h, 20 bytes): `d: f16`, `m: f16`, `qs: [u8; 16]`. Element `j < 16` is the low
//! nibble of `qs[j]`, element `j + 16` the high nibble. `vec_dot_type` Q8_1: the dot product needs
//! `sum(q8)` per block, which Q8_1 carries pre-scaled as `s = d8 * sum(q8)`.

use super::fp::{c_f32_to_i8, f32_to_f16_ref, read_f16};
use super::q8::QK;
use super::x86::{fma, fma_lanes, hsum_float_8};
use crate::faults::Fault;

/// Bytes per block.
pub(crate) const BYTES: usize = 20;

/// Byte offset of the block's `m` (2; 0 under the mutation suite's [`Fault::QuantMinMisread`]).
#[inline]
pub(crate) fn min_offset() -> usize {
    if crate::faults::is(Fault::QuantMinMisread) {
        0
    } else {
        2
    }
}

/// One block to f32 (`dequantize_row_q4_1`: `y = q * d + m`, multiply then add).
#[inline(always)]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK]) {
    let d = read_f16(blk, 0);
    let m = read_f16(blk, min_offset());
    let qs = &blk[4..4 + QK / 2];
    for j in 0..QK / 2 {
        out[j] = f32::from(qs[j] & 0x0F) * d + m;
        out[j + QK / 2] = f32::from(qs[j] >> 4) * d + m;
    }
}

/// `quantize_row_q4_1_ref` (ggml-quants.c): `min`/`max` from `FLT_MAX`/`-FLT_MAX`, `d = (max - min)/15`,
/// `id = d ? 1/d : 0`, `q = MIN(15, (int8_t)((x - min)*id + 0.5f))`.
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
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[0..2].copy_from_slice(&f32_to_f16_ref(d).to_le_bytes());
        blk[2..4].copy_from_slice(&f32_to_f16_ref(min).to_le_bytes());
        let q = |v: f32| i32::from(c_f32_to_i8((v - min) * id + 0.5)).min(15) as u8;
        for j in 0..QK / 2 {
            blk[4 + j] = q(x[j]) | (q(x[j + QK / 2]) << 4);
        }
    }
}

/// `ggml_vec_dot_q4_1_q8_1`, x86 AVX2 branch (arch/x86/quants.c) — the kernel every Q4_1 matmul on this
/// machine runs (no tinyBLAS or repack path exists for Q4_1). Per block: `summs = fma(m_w, s_x, summs)`
/// (gcc contracts `summs += m*s`), `d = d_w * d_x`, eight i32 lanes of `q4 * q8` over four consecutive
/// elements (`mul_sum_us8_pairs_float`, unsigned nibbles, no sign trick), `acc[l] = fma(d, lane[l], acc[l])`.
/// Result `hsum_float_8(acc) + summs`.
pub(crate) fn dot_q8_1(w: &[u8], xq: &[i8], xd: &[f32], xs: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    let m_at = min_offset();
    for (((blk, qy), &dy), &sy) in w
        .chunks_exact(BYTES)
        .zip(xq.chunks_exact(QK))
        .zip(xd)
        .zip(xs)
    {
        let dw = read_f16(blk, 0);
        let mw = read_f16(blk, m_at);
        summs = fma(mw, sy, summs);
        let d = dw * dy;
        let qs = &blk[4..4 + QK / 2];
        let mut lanes = [0i32; 8];
        for l in 0..4 {
            for k in 4 * l..4 * l + 4 {
                lanes[l] += i32::from(qs[k] & 0x0F) * i32::from(qy[k]);
                lanes[l + 4] += i32::from(qs[k] >> 4) * i32::from(qy[k + 16]);
            }
        }
        fma_lanes(d, &lanes, &mut acc);
    }
    hsum_float_8(&acc) + summs
}
