//! IQ4_NL: 32 4-bit indices into a fixed non-linear table of 16 values, with an f16 scale;
//! value = `d * kvalues_iq4nl[q]`.
//!
//! `block_iq4_nl` (ggml-common.h, 18 bytes): `d: f16`, `qs: [u8; 16]` (element `j < 16` is the low nibble
//! of `qs[j]`, element `j + 16` the high nibble). `vec_dot_type` Q8_0. The table `kvalues_iq4nl`
//! (ggml-common.h) is shared with IQ4_XS.

use super::fp::read_f16;
use super::q8::QK;
use super::x86::{fma_lanes, hsum_float_8, sign_trick_mul};

/// Bytes per block.
pub(crate) const BYTES: usize = 18;

/// `kvalues_iq4nl` (ggml-common.h): the 16 signed values a 4-bit IQ4_NL / IQ4_XS index stands for.
pub(crate) const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 32 table values of one block's 16 index bytes `qs`, in element order (low nibbles first).
#[inline]
pub(crate) fn values(qs: &[u8]) -> [i32; QK] {
    let mut v = [0i32; QK];
    for j in 0..QK / 2 {
        v[j] = i32::from(KVALUES[usize::from(qs[j] & 0x0F)]);
        v[j + QK / 2] = i32::from(KVALUES[usize::from(qs[j] >> 4)]);
    }
    v
}

/// One block to f32 (`dequantize_row_iq4_nl`, ggml-quants.c: `y = d * kvalues_iq4nl[q]`).
#[inline]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK]) {
    let d = read_f16(blk, 0);
    for (o, v) in out.iter_mut().zip(values(&blk[2..BYTES])) {
        *o = d * v as f32;
    }
}

/// The eight i32 lanes of one block: lane `l` = `Σ_{k<4} v[4l+k] * q8[4l+k]`, with the `_mm256_sign_epi8`
/// product ([`sign_trick_mul`]) when `SIGN_EXACT` (an activation quant may be −128), the plain one
/// otherwise (they agree unless a quant is −128).
#[inline]
fn lanes<const SIGN_EXACT: bool>(v: &[i32; QK], qy: &[i8]) -> [i32; 8] {
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
    lanes
}

/// `ggml_vec_dot_iq4_nl_q8_0`, x86 AVX2 branch (arch/x86/quants.c). Blocks in pairs: the even block of each
/// pair goes to accumulator `acc1`, the odd one to `acc2`, each as `acc[l] = fma(d_x*d_w, lane[l], acc[l])`
/// with the lanes of `mul_add_epi8` (sign trick) + `madd(·, 1)`; then `hsum_float_8(acc1 + acc2)`. An odd
/// last block takes the scalar tail: plain integer products, `sumf += (d_x*d_w) * sumi`, rounded twice (not
/// contracted to an fma in this build: the odd-block fixtures of `tests/quant_vs_gguf.rs` tell the two
/// apart).
pub(crate) fn dot_q8_0<const SIGN_EXACT: bool>(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let nb = xd.len().min(w.len() / BYTES);
    let mut acc = [[0f32; 8]; 2];
    let pairs = nb / 2 * 2;
    for ib in 0..pairs {
        let blk = &w[ib * BYTES..(ib + 1) * BYTES];
        let d = xd[ib] * read_f16(blk, 0);
        let l = lanes::<SIGN_EXACT>(&values(&blk[2..]), &xq[ib * QK..(ib + 1) * QK]);
        fma_lanes(d, &l, &mut acc[ib % 2]);
    }
    let sum: [f32; 8] = core::array::from_fn(|l| acc[0][l] + acc[1][l]);
    let mut sumf = hsum_float_8(&sum);
    if nb > pairs {
        let ib = pairs;
        let blk = &w[ib * BYTES..(ib + 1) * BYTES];
        let d = xd[ib] * read_f16(blk, 0);
        let sumi: i32 = values(&blk[2..])
            .iter()
            .zip(&xq[ib * QK..(ib + 1) * QK])
            .map(|(&v, &y)| v * i32::from(y))
            .sum();
        sumf += d * sumi as f32;
    }
    sumf
}

/// One output of llamafile's `tinyBLAS_Q0_AVX<block_iq4_nl, block_q8_0>` (ggml-cpu/llamafile/sgemm.cpp),
/// which computes IQ4_NL matmuls with a batch ≥ 2 when the weight is not repacked: one eight-lane
/// accumulator over all blocks, `acc[l] = fma(d_w*d_x, lane[l], acc[l])` with the `updot` lanes
/// (`vpdpbusd` of `sign(a, a)` and `sign(b, a)`: the sign-trick products), then `hsum` (= `hsum_float_8`).
/// Unlike Q4_0/Q5_0/Q8_0, this is *not* the vec_dot kernel's order (which alternates two accumulators).
pub(crate) fn dot_q8_0_tinyblas<const SIGN_EXACT: bool>(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for ((blk, qy), &dy) in w.chunks_exact(BYTES).zip(xq.chunks_exact(QK)).zip(xd) {
        let d = read_f16(blk, 0) * dy;
        fma_lanes(d, &lanes::<SIGN_EXACT>(&values(&blk[2..]), qy), &mut acc);
    }
    hsum_float_8(&acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantizes_a_hand_made_block() {
        let mut blk = [0u8; BYTES];
        blk[0..2].copy_from_slice(&half::f16::from_f32(0.25).to_le_bytes());
        for j in 0..16 {
            blk[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut out = [0f32; QK];
        dequantize_block(&blk, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], 0.25 * f32::from(KVALUES[j]));
            assert_eq!(out[j + 16], 0.25 * f32::from(KVALUES[15 - j]));
        }
    }

    #[test]
    fn vec_dot_and_tinyblas_orders_differ_only_in_rounding() {
        // same blocks, same exact value; the two accumulation orders may round differently, both stay
        // within a few ulps of the magnitude
        let nb = 7;
        let mut w = vec![0u8; nb * BYTES];
        let mut s = 0x1234_5678u32;
        for (i, b) in w.iter_mut().enumerate() {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            *b = (s >> 24) as u8;
            if i % BYTES == 1 {
                *b &= 0x3B; // a modest positive f16 scale
            }
        }
        let xq: Vec<i8> = (0..nb * QK)
            .map(|i| (((i * 37) % 255) as i32 - 127) as i8)
            .collect();
        let xd: Vec<f32> = (0..nb).map(|i| 0.01 + i as f32 * 1e-3).collect();
        let a = dot_q8_0::<false>(&w, &xq, &xd);
        let b = dot_q8_0_tinyblas::<false>(&w, &xq, &xd);
        let mut exact = 0f64;
        let mut mag = 0f64;
        for ib in 0..nb {
            let blk = &w[ib * BYTES..(ib + 1) * BYTES];
            let d = f64::from(xd[ib] * read_f16(blk, 0));
            for (v, &y) in values(&blk[2..]).iter().zip(&xq[ib * QK..]) {
                exact += d * f64::from(*v) * f64::from(y);
                mag += (d * f64::from(*v) * f64::from(y)).abs();
            }
        }
        for r in [a, b] {
            assert!((f64::from(r) - exact).abs() <= mag * 1e-6, "{r} vs {exact}");
        }
        assert_eq!(
            dot_q8_0::<true>(&w, &xq, &xd).to_bits(),
            a.to_bits(),
            "no -128 quant: the sign trick changes nothing"
        );
    }
}
