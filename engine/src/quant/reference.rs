//! Reference-mode dot products: dequantize each weight block to f32 (the same values
//! [`super::dequantize_row`] gives) and multiply-accumulate in f32 against the f32 activation.
//!
//! Accumulation order with SIMD off (fixed, documented so that results are reproducible): element `i` of the
//! row is added to partial sum `i % 8` as a rounded product (`lane += w * x`, no fma); the eight partial sums
//! are combined as `((p4+p0) + (p6+p2)) + ((p5+p1) + (p7+p3))`. Eight interleaved sums are both more accurate
//! than one running sum and vectorizable. With SIMD on (any setting), reference mode uses the 16-lane fma
//! order of `reference_fma.rs` instead ([`dot_dequantized`], `super::vec_dot`).

use super::x86::hsum_float_8;

/// Dot product of blocks of `QK` elements, `bytes` each, dequantized by `deq`.
#[inline(always)]
pub(crate) fn dot_blocks<const QK: usize>(
    w: &[u8],
    bytes: usize,
    x: &[f32],
    deq: impl Fn(&[u8], &mut [f32; QK]),
) -> f32 {
    let mut lanes = [0f32; 8];
    let mut buf = [0f32; QK];
    for (blk, xs) in w.chunks_exact(bytes).zip(x.chunks_exact(QK)) {
        deq(blk, &mut buf);
        for (wc, xc) in buf.chunks_exact(8).zip(xs.chunks_exact(8)) {
            for k in 0..8 {
                lanes[k] += wc[k] * xc[k];
            }
        }
    }
    hsum_float_8(&lanes)
}

/// Dot product of a weight row already dequantized to f32 (`w`, e.g. by [`super::dequantize_row`]) with `x`.
///
/// `simd` false (the session runs with [`crate::Simd::Off`]): the portable order of this module (element `i`
/// into lane `i % 8` as a rounded product, no fma; lanes combined by `hsum_float_8`), bit-identical to the
/// type's [`dot_blocks`] / [`dot_elems`] on the same row. `simd` true: the 16-lane fma order of
/// `reference_fma.rs`, with the best kernels of this CPU (the same bits from every kernel kind).
#[inline]
pub(crate) fn dot_dequantized(w: &[f32], x: &[f32], simd: bool) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    if simd {
        return super::reference_fma::dot(super::reference_fma::Lanes16::detect(), w, x);
    }
    dot_lanes8(w, x)
}

/// The eight-lane f32 dot of [`dot_dequantized`] with SIMD off.
#[inline(always)]
pub(crate) fn dot_lanes8(w: &[f32], x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let full = x.len().min(w.len()) / 8 * 8;
    for (wc, xc) in w[..full].chunks_exact(8).zip(x[..full].chunks_exact(8)) {
        for k in 0..8 {
            lanes[k] += wc[k] * xc[k];
        }
    }
    for i in full..x.len().min(w.len()) {
        lanes[i % 8] += w[i] * x[i];
    }
    hsum_float_8(&lanes)
}

/// Dot product of plain elements of `size` bytes converted by `conv`.
#[inline(always)]
pub(crate) fn dot_elems(w: &[u8], size: usize, x: &[f32], conv: impl Fn(&[u8]) -> f32) -> f32 {
    let mut lanes = [0f32; 8];
    let full = x.len() / 8 * 8;
    for (wc, xc) in w.chunks_exact(8 * size).zip(x[..full].chunks_exact(8)) {
        for k in 0..8 {
            lanes[k] += conv(&wc[k * size..(k + 1) * size]) * xc[k];
        }
    }
    for (i, &xi) in x.iter().enumerate().skip(full) {
        lanes[i % 8] += conv(&w[i * size..(i + 1) * size]) * xi;
    }
    hsum_float_8(&lanes)
}

#[cfg(test)]
mod tests {
    use super::super::table::traits;
    use super::super::types::GgmlType;
    use super::super::{dequantize_row, reference_fma, vec_dot, PreparedRow};
    use super::super::{iq4_nl, q4_0, q4_1, q5_0, q8};
    use crate::numerics::NumericsMode;

    /// Checks one row both ways: SIMD off, the type's fused portable dot = dequantize + [`dot_lanes8`]
    /// (and `dot_dequantized(.., false)`); SIMD on, `vec_dot` = dequantize + the 16-lane fma mirror
    /// `reference_fma::dot_scalar` (and `dot_dequantized(.., true)`). Bits compared.
    fn check(ty: GgmlType, w: &[u8], x: &[f32]) {
        let mut deq = vec![0f32; x.len()];
        dequantize_row(ty, w, &mut deq).unwrap();
        let portable = (traits(ty).unwrap().dot.as_ref().unwrap().reference)(w, x);
        let lanes8 = super::dot_lanes8(&deq, x);
        assert_eq!(portable.to_bits(), lanes8.to_bits(), "{ty} portable");
        assert_eq!(
            super::dot_dequantized(&deq, x, false).to_bits(),
            lanes8.to_bits()
        );
        let mirror = reference_fma::dot_scalar(&deq, x);
        assert_eq!(
            super::dot_dequantized(&deq, x, true).to_bits(),
            mirror.to_bits(),
            "{ty}"
        );
        for simd in [false, true] {
            let mut p = PreparedRow::new();
            p.prepare_simd(ty, NumericsMode::Reference, x, simd)
                .unwrap();
            let want = if simd { mirror } else { lanes8 };
            assert_eq!(
                vec_dot(ty, w, &p).to_bits(),
                want.to_bits(),
                "{ty} simd {simd}"
            );
        }
    }

    /// Both reference orders, per-token (`vec_dot`, fused per block) and on a dequantized row, give the
    /// same bits, for every type with a reference quantizer (blocks from it) and lengths that are not a
    /// multiple of 8 or 16 for the floats.
    #[test]
    fn per_token_and_dequantized_dots_agree_in_both_orders() {
        let mut rng = crate::quant::test_rng::Rng(0x9e37_79b9_7f4a_7c15u64);
        let mut rnd = move || rng.uniform();
        for (ty, n) in [
            (GgmlType::Q4_0, 256),
            (GgmlType::Q4_1, 256),
            (GgmlType::Q5_0, 256),
            (GgmlType::Q5_1, 256),
            (GgmlType::Q8_0, 256),
            (GgmlType::IQ4_NL, 256),
            (GgmlType::Q2_K, 512),
            (GgmlType::Q3_K, 512),
            (GgmlType::Q4_K, 512),
            (GgmlType::Q5_K, 512),
            (GgmlType::Q6_K, 512),
            (GgmlType::IQ4_XS, 512),
            (GgmlType::F16, 45),
            (GgmlType::BF16, 45),
            (GgmlType::F32, 45),
            (GgmlType::F32, 16),
        ] {
            for _ in 0..20 {
                let w: Vec<f32> = (0..n).map(|_| rnd()).collect();
                let x: Vec<f32> = (0..n).map(|_| rnd() * 4.0).collect();
                let blocks = super::super::quantize_row(ty, &w).unwrap();
                check(ty, &blocks, &x);
            }
        }
    }

    /// The same on blocks of random bytes (every quant and high-bit pattern, not only what a quantizer
    /// writes), with the f16 scale fields set to finite values of either sign; F16/BF16 rows of random
    /// finite values at lengths with and without a tail.
    #[test]
    fn both_orders_agree_on_random_blocks() {
        let mut rng = crate::quant::test_rng::Rng(0x2545_f491_4f6c_dd1du64);
        let mut next = move || rng.next();
        let scale =
            |r: u64| half::f16::from_f32(((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2);
        // (type, block bytes, offsets of f16 fields)
        for (ty, bytes, f16_at) in [
            (GgmlType::Q8_0, q8::Q8_0_BYTES, &[0usize][..]),
            (GgmlType::Q4_0, q4_0::BYTES, &[0][..]),
            (GgmlType::Q4_1, q4_1::BYTES, &[0, 2][..]),
            (GgmlType::Q5_0, q5_0::BYTES, &[0][..]),
            (GgmlType::IQ4_NL, iq4_nl::BYTES, &[0][..]),
        ] {
            for _ in 0..50 {
                let nb = 7;
                let mut w: Vec<u8> = (0..nb * bytes).map(|_| next() as u8).collect();
                for b in 0..nb {
                    for &at in f16_at {
                        let h = scale(next()).to_bits().to_le_bytes();
                        w[b * bytes + at..b * bytes + at + 2].copy_from_slice(&h);
                    }
                }
                let x: Vec<f32> = (0..nb * 32)
                    .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0)
                    .collect();
                check(ty, &w, &x);
            }
        }
        for ty in [GgmlType::F16, GgmlType::BF16] {
            for n in [8, 37, 64, 71] {
                let vals: Vec<f32> = (0..n)
                    .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0)
                    .collect();
                let w = super::super::quantize_row(ty, &vals).unwrap();
                let x: Vec<f32> = (0..n)
                    .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0)
                    .collect();
                check(ty, &w, &x);
            }
        }
    }
}
