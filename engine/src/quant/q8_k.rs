//! Q8_K: the activation type of the K-quants. 256 signed 8-bit quants with an f32 scale and sums of 16.
//!
//! `block_q8_K` (ggml-common.h, 292 bytes): `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]` (sum of each 16
//! quants). Never stored in model files. On x86, ggml-cpu's `quantize_row_q8_K` calls
//! `quantize_row_q8_K_ref` (libggml-base) — mirrored here.

use super::fp::read_f32;

/// Elements per block (`QK_K`).
pub(crate) const QK_K: usize = 256;
/// Bytes per block.
pub(crate) const BYTES: usize = 292;

/// `nearest_int` (ggml-quants.c): round to nearest even via the `+ 1.5 * 2^23` trick, garbage (not UB) for
/// |x| > 2^22 and NaN, exactly as the C code.
#[inline]
fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12582912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `quantize_row_q8_K_ref`: per block, `max` = the first element of largest |x|; an all-zero block gives
/// `d = 0` and zero quants (and zero `bsums`, which ggml leaves unwritten); else `iscale = -127/max`,
/// `q = (int8_t)MIN(127, nearest_int(iscale*x))`, `bsums` = sums of 16 quants, `d = 1/iscale`.
/// Writes blocks to `dst` and the decoded quants, scales and sums to `qs`, `ds`, `bsums`.
pub(crate) fn quantize(
    src: &[f32],
    dst: &mut [u8],
    qs: &mut [i8],
    ds: &mut [f32],
    bsums: &mut [i16],
) {
    for ((((x, blk), q), d), bs) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(BYTES))
        .zip(qs.chunks_exact_mut(QK_K))
        .zip(ds.iter_mut())
        .zip(bsums.chunks_exact_mut(QK_K / 16))
    {
        let mut max = 0f32;
        let mut amax = 0f32;
        for &v in x {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            blk.fill(0);
            q.fill(0);
            bs.fill(0);
            *d = 0.0;
            continue;
        }
        let iscale = -127.0 / max;
        for (qi, &v) in q.iter_mut().zip(x) {
            *qi = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, g) in bs.iter_mut().zip(q.chunks_exact(16)) {
            *s = g.iter().map(|&v| i32::from(v)).sum::<i32>() as i16;
        }
        *d = 1.0 / iscale;
        blk[0..4].copy_from_slice(&d.to_le_bytes());
        for (b, &v) in blk[4..4 + QK_K].iter_mut().zip(q.iter()) {
            *b = v as u8;
        }
        for (b, s) in blk[4 + QK_K..].chunks_exact_mut(2).zip(bs.iter()) {
            b.copy_from_slice(&s.to_le_bytes());
        }
    }
}

/// One block to f32 (`dequantize_row_q8_K`: `y = d * qs[j]`).
#[inline(always)]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK_K]) {
    let d = read_f32(blk, 0);
    for (o, &q) in out.iter_mut().zip(&blk[4..4 + QK_K]) {
        *o = d * f32::from(q as i8);
    }
}

/// `quantize_row_q8_K_ref` (ggml-quants.c) writing only the block bytes: [`quantize`] with its unpacked
/// outputs (quants, scales, block sums) thrown away. `src` holds whole 256-element blocks, `dst` their
/// `BYTES`-byte blocks.
pub(crate) fn quantize_row_ref(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK_K;
    let (mut qs, mut d, mut bs) = (vec![0i8; src.len()], vec![0f32; nb], vec![0i16; nb * 16]);
    quantize(src, dst, &mut qs, &mut d, &mut bs);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_is_round_half_even() {
        for v in [0.5f32, 1.5, 2.5, -0.5, -1.5, 126.5, -127.0, 3.4999] {
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
        }
    }

    #[test]
    fn quantize_block_properties() {
        let src: Vec<f32> = (0..512)
            .map(|i| ((i * 7919 % 997) as f32 - 498.0) * 0.01)
            .collect();
        let mut blk = vec![0u8; 2 * BYTES];
        let mut qs = vec![0i8; 512];
        let mut ds = vec![0f32; 2];
        let mut bs = vec![0i16; 32];
        quantize(&src, &mut blk, &mut qs, &mut ds, &mut bs);
        for b in 0..2 {
            let q = &qs[b * 256..b * 256 + 256];
            // the max-magnitude element maps to -127 (iscale = -127/max)
            assert!(q.contains(&-127));
            for g in 0..16 {
                let s: i32 = q[g * 16..g * 16 + 16].iter().map(|&v| i32::from(v)).sum();
                assert_eq!(i32::from(bs[b * 16 + g]), s);
            }
            let mut out = [0f32; QK_K];
            dequantize_block(&blk[b * BYTES..(b + 1) * BYTES], &mut out);
            for (o, x) in out.iter().zip(&src[b * 256..]) {
                assert!((o - x).abs() <= ds[b].abs() * 0.5001);
            }
        }
        // zero block and NaN do not panic
        let mut z = vec![0f32; 256];
        quantize(
            &z,
            &mut blk[..BYTES],
            &mut qs[..256],
            &mut ds[..1],
            &mut bs[..16],
        );
        assert_eq!(ds[0], 0.0);
        z[5] = f32::NAN;
        z[6] = 1.0;
        quantize(
            &z,
            &mut blk[..BYTES],
            &mut qs[..256],
            &mut ds[..1],
            &mut bs[..16],
        );
    }
}
