//! Q2_K: super-blocks of 256 = 16 sub-blocks of 16 2-bit quants, each with a 4-bit scale and a 4-bit min;
//! value = `d * sc * q - dmin * m`.
//!
//! `block_q2_K` (ggml-common.h, 84 bytes): `scales: [u8; 16]` (sub-block `s`: scale in the low nibble of
//! `scales[s]`, min in the high nibble), `qs: [u8; 64]`, `d: f16`, `dmin: f16`. Each half of 128 elements
//! uses 32 bytes of `qs`: element `128h + 32k + b` is bits `2k..2k+2` of `qs[32h + b]`. `vec_dot_type`
//! Q8_K.

use super::fp::read_f16;
use super::q8_k::QK_K;
use super::x86::{fma, fma_lanes, hsum_float_8, scaled_lanes_16};

/// Bytes per block.
pub(crate) const BYTES: usize = 84;
/// Byte offset of `d` (`dmin` follows).
const D_AT: usize = 80;

/// The 256 2-bit quants (0..4) of one block, in element order.
#[inline]
fn quants(blk: &[u8]) -> [u8; QK_K] {
    let qs = &blk[16..80];
    let mut q = [0u8; QK_K];
    for (i, v) in q.iter_mut().enumerate() {
        let (h, k, b) = (i / 128, (i % 128) / 32, i % 32);
        *v = (qs[32 * h + b] >> (2 * k)) & 3;
    }
    q
}

/// One block to f32 (`dequantize_row_q2_K`, ggml-quants.c: `dl = d * sc`, `ml = dmin * m`,
/// `y = dl * q - ml`, multiply then subtract).
#[inline]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK_K]) {
    let d = read_f16(blk, D_AT);
    let min = read_f16(blk, D_AT + 2);
    for (s, (y, q)) in out
        .chunks_exact_mut(16)
        .zip(quants(blk).chunks_exact(16))
        .enumerate()
    {
        let dl = d * f32::from(blk[s] & 0xF);
        let ml = min * f32::from(blk[s] >> 4);
        for (y, &q) in y.iter_mut().zip(q) {
            *y = dl * f32::from(q) - ml;
        }
    }
}

/// `ggml_vec_dot_q2_K_q8_K`, x86 AVX2 branch (arch/x86/quants.c). Per super-block: `d = d8 * d_w`,
/// `dmin = -d8 * dmin_w`; the eight i32 lanes `m[2l]*bsums[2l] + m[2l+1]*bsums[2l+1]` (`madd` of the mins
/// with the Q8_K sums of 16) are fused first, `acc[l] = fma(dmin, ., acc[l])`; then the eight i32 lanes
/// `lane[l] = Σ_{h<2, k<4} sc[8h + 2k + l/4] * Σ_{e<4} q2[128h+32k+4l+e] * q8[...]` (`maddubs` + `madd` with
/// the shuffled scales, exact) into the same accumulator, `acc[l] = fma(d, ., acc[l])`. Result
/// `hsum_float_8(acc)`.
pub(crate) fn dot_q8_k(w: &[u8], xq: &[i8], xd: &[f32], xbsums: &[i16]) -> f32 {
    let mut acc = [0f32; 8];
    for (((blk, qy), &dy), bsums) in w
        .chunks_exact(BYTES)
        .zip(xq.chunks_exact(QK_K))
        .zip(xd)
        .zip(xbsums.chunks_exact(QK_K / 16))
    {
        let d = dy * read_f16(blk, D_AT);
        let dmin = -dy * read_f16(blk, D_AT + 2);
        let m = |s: usize| i32::from(blk[s] >> 4);
        let sc = |s: usize| i32::from(blk[s] & 0xF);
        let prod: [i32; 8] = core::array::from_fn(|l| {
            m(2 * l) * i32::from(bsums[2 * l]) + m(2 * l + 1) * i32::from(bsums[2 * l + 1])
        });
        fma_lanes(dmin, &prod, &mut acc);
        let lanes = scaled_lanes_16(&quants(blk), qy, sc);
        fma_lanes(d, &lanes, &mut acc);
    }
    hsum_float_8(&acc)
}

/// One output of llama.cpp's tiled K-quant matmul for Q2_K weights that were not repacked (ggml-cpu/tiled,
/// `tiled_run_microtile<16, true, 0>`; the AVX2 and the AVX-512 VNNI kernels compute the same), batches
/// ≥ 8: per super-block the exact integers `s1 = Σ_s sc[s] · Σ q2·q8` and `s2 = Σ_s m[s] · bsums[s]`, then
/// `res = d_w·s1`, `res = fma(−dmin_w, s2, res)`, `acc = fma(res, d_x, acc)`.
pub(crate) fn dot_q8_k_tiled(w: &[u8], xq: &[i8], xd: &[f32], xbsums: &[i16]) -> f32 {
    let mut acc = 0f32;
    for (((blk, qy), &dy), bsums) in w
        .chunks_exact(BYTES)
        .zip(xq.chunks_exact(QK_K))
        .zip(xd)
        .zip(xbsums.chunks_exact(QK_K / 16))
    {
        let q = quants(blk);
        let (mut s1, mut s2) = (0i32, 0i32);
        for s in 0..16 {
            let dot: i32 = (16 * s..16 * s + 16)
                .map(|e| i32::from(q[e]) * i32::from(qy[e]))
                .sum();
            s1 = s1.wrapping_add(i32::from(blk[s] & 0xF) * dot);
            s2 = s2.wrapping_add(i32::from(blk[s] >> 4) * i32::from(bsums[s]));
        }
        let res = fma(
            -read_f16(blk, D_AT + 2),
            s2 as f32,
            read_f16(blk, D_AT) * s1 as f32,
        );
        acc = fma(res, dy, acc);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantizes_a_hand_made_block() {
        // d = 1, dmin = 0.5; sub-block s: scale s % 16, min 15 - s; element i quant i % 4 laid out
        // as ggml's bit planes
        let mut blk = [0u8; BYTES];
        for (s, b) in blk[..16].iter_mut().enumerate() {
            *b = (s as u8 & 0xF) | ((15 - s as u8) << 4);
        }
        for h in 0..2 {
            for b in 0..32 {
                let mut byte = 0u8;
                for k in 0..4 {
                    let i = 128 * h + 32 * k + b;
                    byte |= ((i % 4) as u8) << (2 * k);
                }
                blk[16 + 32 * h + b] = byte;
            }
        }
        blk[80..82].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
        blk[82..84].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        let mut out = [0f32; QK_K];
        dequantize_block(&blk, &mut out);
        for (i, &v) in out.iter().enumerate() {
            let s = i / 16;
            let want = s as f32 * (i % 4) as f32 - 0.5 * (15 - s) as f32;
            assert_eq!(v, want, "element {i}");
        }
    }
}
