//! Q8_0 and Q8_1: 32 signed 8-bit quants with an f16 scale (Q8_1 adds `s = d * sum(qs)`).
//!
//! Layouts (ggml-common.h):
//! - `block_q8_0` (34 bytes): `d: f16`, `qs: [i8; 32]`; value `i` is `qs[i] * d`.
//! - `block_q8_1` (36 bytes): `d: f16`, `s: f16`, `qs: [i8; 32]`. Only an activation type: the `vec_dot_type`
//!   of Q4_1 (and Q5_1).
//!
//! Two quantizers each, which differ:
//! - `quantize_row_q8_0_ref` / `quantize_row_q8_1_ref` (ggml-quants.c, libggml-base): `id = 1/d`,
//!   `roundf` (half away from zero), C float→int8 conversion, software f16 (canonical NaN). They write model
//!   files: [`quantize_ref_q8_0`], [`quantize_ref_q8_1`].
//! - `quantize_row_q8_0` / `quantize_row_q8_1` in ggml-cpu/arch/x86/quants.c (AVX/AVX2 branch), which
//!   ggml-cpu's mul_mat uses on the activation row: `id = 127/max`, round half to even, saturating packs,
//!   F16C. These are [`quantize_act_q8_0`], [`quantize_act_q8_1`]. On ties (`x*id = k + 0.5`) the two give
//!   different quants.

use super::fp::{c_f32_to_i8, f32_to_f16_cpu, f32_to_f16_ref, read_f16};
use super::x86::{
    block_absmax_avx, fma_lanes, hsum_float_8, round_even_cvt_i32, saturate_i8, sign_trick_mul,
};

/// Elements per block.
pub(crate) const QK: usize = 32;
/// Bytes per `block_q8_0`.
pub(crate) const Q8_0_BYTES: usize = 34;
/// Bytes per `block_q8_1`.
pub(crate) const Q8_1_BYTES: usize = 36;

/// One `block_q8_0` to f32 (`dequantize_row_q8_0`: `y = qs[j] * d`).
#[inline(always)]
pub(crate) fn dequantize_block_q8_0(blk: &[u8], out: &mut [f32; QK]) {
    let d = read_f16(blk, 0);
    for (o, &q) in out.iter_mut().zip(&blk[2..2 + QK]) {
        *o = f32::from(q as i8) * d;
    }
}

/// One `block_q8_1` to f32: `qs[j] * d` (the `s` field is redundant).
#[inline(always)]
pub(crate) fn dequantize_block_q8_1(blk: &[u8], out: &mut [f32; QK]) {
    let d = read_f16(blk, 0);
    for (o, &q) in out.iter_mut().zip(&blk[4..4 + QK]) {
        *o = f32::from(q as i8) * d;
    }
}

/// `quantize_row_q8_0_ref` (ggml-quants.c): `amax = MAX(amax, |x|)`, `d = amax/127`, `id = d ? 1/d : 0`,
/// `qs = (int8_t)roundf(x*id)`. `src.len()` is a multiple of 32; `dst` holds `src.len()/32` blocks.
pub(crate) fn quantize_ref_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let (d, id) = ref_scale(x);
        blk[0..2].copy_from_slice(&f32_to_f16_ref(d).to_le_bytes());
        for (q, &v) in blk[2..].iter_mut().zip(x) {
            *q = c_f32_to_i8((v * id).round()) as u8;
        }
    }
}

/// `quantize_row_q8_1_ref` (ggml-quants.c): as [`quantize_ref_q8_0`], plus `s = (float)sum(qs) * d`.
pub(crate) fn quantize_ref_q8_1(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_1_BYTES)) {
        let (d, id) = ref_scale(x);
        blk[0..2].copy_from_slice(&f32_to_f16_ref(d).to_le_bytes());
        let mut sum = 0i32;
        for (q, &v) in blk[4..].iter_mut().zip(x) {
            let qi = c_f32_to_i8((v * id).round());
            sum += i32::from(qi);
            *q = qi as u8;
        }
        blk[2..4].copy_from_slice(&f32_to_f16_ref(sum as f32 * d).to_le_bytes());
    }
}

/// The `_ref` quantizers' block scale: `amax` by C's `MAX(a, b) = a > b ? a : b` in element order,
/// `d = amax / 127`, `id = d != 0 ? 1/d : 0` (a NaN `d` is "true" in C, so `id` is NaN then).
#[inline]
fn ref_scale(x: &[f32]) -> (f32, f32) {
    let mut amax = 0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

/// The x86 activation quantizer's block: `max` by the AVX lane tree, `d = max/127`,
/// `id = max != 0 ? 127/max : 0`, quants `saturate(round_half_even(x*id))` (NaN → -128). Returns `d` and the
/// unsaturated i32 quants (the `s` of Q8_1 sums those).
#[inline]
fn act_block(x: &[f32], q: &mut [i32; QK]) -> f32 {
    let max = block_absmax_avx(x);
    let d = max / 127.0;
    let id = if max != 0.0 { 127.0 / max } else { 0.0 };
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = round_even_cvt_i32(v * id);
    }
    d
}

/// x86 `quantize_row_q8_0` (arch/x86/quants.c, AVX2 branch): the activation quantizer ggml-cpu runs for
/// weights whose `vec_dot_type` is Q8_0. Writes blocks to `dst`; also returns the decoded quants/scales into
/// `qs` / `ds` for the dot kernels, and whether any quant is -128 (NaN input).
pub(crate) fn quantize_act_q8_0(
    src: &[f32],
    dst: &mut [u8],
    qs: &mut [i8],
    ds: &mut [f32],
) -> bool {
    let mut has_min = false;
    let mut q = [0i32; QK];
    for (((x, blk), qs), dd) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(Q8_0_BYTES))
        .zip(qs.chunks_exact_mut(QK))
        .zip(ds.iter_mut())
    {
        let d = act_block(x, &mut q);
        let dh = f32_to_f16_cpu(d);
        blk[0..2].copy_from_slice(&dh.to_le_bytes());
        *dd = read_f16(blk, 0);
        for ((b, o), &qi) in blk[2..].iter_mut().zip(qs.iter_mut()).zip(&q) {
            let v = saturate_i8(qi);
            has_min |= v == -128;
            *o = v;
            *b = v as u8;
        }
    }
    has_min
}

/// x86 `quantize_row_q8_1` (arch/x86/quants.c, AVX2 branch): as [`quantize_act_q8_0`], plus
/// `s = f16(d * (float)hsum_i32(quants))`, where the sum runs over the i32 quants before saturation
/// (wrapping, as `_mm256_add_epi32`). Also returns the decoded `s` into `ss`.
pub(crate) fn quantize_act_q8_1(
    src: &[f32],
    dst: &mut [u8],
    qs: &mut [i8],
    ds: &mut [f32],
    ss: &mut [f32],
) {
    let mut q = [0i32; QK];
    for ((((x, blk), qs), dd), sd) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(Q8_1_BYTES))
        .zip(qs.chunks_exact_mut(QK))
        .zip(ds.iter_mut())
        .zip(ss.iter_mut())
    {
        let d = act_block(x, &mut q);
        let sum = q.iter().fold(0i32, |a, &v| a.wrapping_add(v));
        blk[0..2].copy_from_slice(&f32_to_f16_cpu(d).to_le_bytes());
        blk[2..4].copy_from_slice(&f32_to_f16_cpu(d * sum as f32).to_le_bytes());
        *dd = read_f16(blk, 0);
        *sd = read_f16(blk, 2);
        for ((b, o), &qi) in blk[4..].iter_mut().zip(qs.iter_mut()).zip(&q) {
            let v = saturate_i8(qi);
            *o = v;
            *b = v as u8;
        }
    }
}

/// `ggml_vec_dot_q8_0_q8_0`, x86 AVX2 branch (arch/x86/quants.c; llamafile's `tinyBLAS_Q0_AVX` computes
/// the same per output): per block, `d = d_w * d_x` (one f32 multiply), eight i32 lane sums of four
/// products each (`mul_sum_i8_pairs_float`), `acc[l] = fma(d, lane[l], acc[l])`; then `hsum_float_8`.
/// `SIGN_EXACT` selects the `sign_epi8` product (only differs when an activation quant is -128).
pub(crate) fn dot_q8_0_q8_0<const SIGN_EXACT: bool>(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for ((blk, qy), &dy) in w.chunks_exact(Q8_0_BYTES).zip(xq.chunks_exact(QK)).zip(xd) {
        let d = read_f16(blk, 0) * dy;
        let qx = &blk[2..2 + QK];
        let mut lanes = [0i32; 8];
        for (l, lane) in lanes.iter_mut().enumerate() {
            for k in 4 * l..4 * l + 4 {
                let x = i32::from(qx[k] as i8);
                *lane += if SIGN_EXACT {
                    sign_trick_mul(x, qy[k])
                } else {
                    x * i32::from(qy[k])
                };
            }
        }
        fma_lanes(d, &lanes, &mut acc);
    }
    hsum_float_8(&acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn act(src: &[f32]) -> (Vec<u8>, Vec<i8>, Vec<f32>, bool) {
        let nb = src.len() / QK;
        let mut blocks = vec![0u8; nb * Q8_0_BYTES];
        let mut qs = vec![0i8; src.len()];
        let mut ds = vec![0f32; nb];
        let m = quantize_act_q8_0(src, &mut blocks, &mut qs, &mut ds);
        (blocks, qs, ds, m)
    }

    #[test]
    fn ref_round_trip_error_is_within_half_step() {
        let src: Vec<f32> = (0..96)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.013)
            .collect();
        let mut blocks = vec![0u8; 3 * Q8_0_BYTES];
        quantize_ref_q8_0(&src, &mut blocks);
        let mut out = [0f32; QK];
        for (b, x) in blocks.chunks_exact(Q8_0_BYTES).zip(src.chunks_exact(QK)) {
            dequantize_block_q8_0(b, &mut out);
            let d = read_f16(b, 0);
            for (o, v) in out.iter().zip(x) {
                // d is rounded to f16, so allow half a step plus the scale's relative error over 127 steps
                assert!((o - v).abs() <= 0.5 * d + 127.0 * d * 1e-3, "{o} vs {v}");
            }
        }
    }

    #[test]
    fn ref_rounds_half_away_act_rounds_half_even() {
        // max 127 → d = 1 (exact in f16), id = 1 in both quantizers, so x*id = x exactly
        let mut x = [0f32; QK];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 3.5;
        let mut r = [0u8; Q8_0_BYTES];
        quantize_ref_q8_0(&x, &mut r);
        assert_eq!([r[3] as i8, r[4] as i8, r[5] as i8], [3, -3, 4]);
        let (a, ..) = act(&x);
        assert_eq!([a[3] as i8, a[4] as i8, a[5] as i8], [2, -2, 4]);
    }

    #[test]
    fn q8_1_s_is_d_times_sum() {
        let src: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.37).collect();
        let mut blocks = vec![0u8; 2 * Q8_1_BYTES];
        let mut qs = vec![0i8; 64];
        let (mut ds, mut ss) = (vec![0f32; 2], vec![0f32; 2]);
        quantize_act_q8_1(&src, &mut blocks, &mut qs, &mut ds, &mut ss);
        for (b, blk) in blocks.chunks_exact(Q8_1_BYTES).enumerate() {
            let sum: i32 = qs[b * 32..b * 32 + 32].iter().map(|&q| i32::from(q)).sum();
            let d_f32 = block_absmax_avx(&src[b * 32..b * 32 + 32]) / 127.0;
            assert_eq!(ss[b], read_f16(blk, 2));
            assert_eq!(
                read_f16(blk, 2),
                f32::from(half::f16::from_f32(d_f32 * sum as f32))
            );
            assert_eq!(
                &blk[4..],
                qs[b * 32..b * 32 + 32]
                    .iter()
                    .map(|&q| q as u8)
                    .collect::<Vec<_>>()
            );
        }
        let mut r = vec![0u8; 2 * Q8_1_BYTES];
        quantize_ref_q8_1(&src, &mut r);
        for blk in r.chunks_exact(Q8_1_BYTES) {
            let sum: i32 = blk[4..].iter().map(|&q| i32::from(q as i8)).sum();
            assert_eq!(
                read_f16(blk, 2),
                f32::from(half::f16::from_f32(sum as f32 * read_f16(blk, 0)))
            );
        }
    }

    #[test]
    fn zero_and_extreme_blocks() {
        let mut src = vec![0f32; 96];
        src[32..64].fill(f32::MAX);
        src[64] = -f32::MAX;
        let (b, qs, ds, m) = act(&src);
        assert!(qs[..32].iter().all(|&q| q == 0) && ds[0] == 0.0 && !m);
        // max/127 overflows f16 → d = inf; x * (127/max) = 127
        assert!(ds[1].is_infinite());
        assert!(qs[32..64].iter().all(|&q| q == 127));
        assert_eq!(qs[64], -127);
        assert_eq!(b.len(), 3 * Q8_0_BYTES);
        let mut r = vec![0u8; 3 * Q8_0_BYTES];
        quantize_ref_q8_0(&src, &mut r);
        assert!(r[..Q8_0_BYTES].iter().all(|&v| v == 0));
    }

    #[test]
    fn nan_and_inf_do_not_panic() {
        let mut src: Vec<f32> = (0..64).map(|i| i as f32).collect();
        src[3] = f32::NAN;
        src[27] = f32::NAN;
        src[40] = f32::INFINITY;
        let (_, qs, ds, m) = act(&src);
        // NaN at element 27 survives the max tree: d NaN, every quant from NaN * x → -128
        assert!(ds[0].is_nan() && m);
        assert!(qs[..32].iter().all(|&q| q == -128));
        // inf max: id = 127/inf = 0, finite * 0 = 0, inf * 0 = NaN → -128
        assert!(ds[1].is_infinite());
        assert_eq!(qs[40], -128);
        assert_eq!(qs[41], 0);
        let mut r = vec![0u8; 2 * Q8_0_BYTES];
        quantize_ref_q8_0(&src, &mut r);
        let mut r1 = vec![0u8; 2 * Q8_1_BYTES];
        quantize_ref_q8_1(&src, &mut r1);
        let w = r.clone();
        let _ = dot_q8_0_q8_0::<true>(&w, &qs, &ds);
        let _ = dot_q8_0_q8_0::<false>(&w, &qs, &ds);
    }
}
