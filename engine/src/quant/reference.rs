//! Reference-mode dot products: dequantize each weight block to f32 (the same values
//! [`super::dequantize_row`] gives) and multiply-accumulate in f32 against the f32 activation.
//!
//! Accumulation order (fixed, documented so that results are reproducible): element `i` of the row is added
//! to partial sum `i % 8` as a rounded product (`lane += w * x`, no fma); the eight partial sums are combined
//! as `((p4+p0) + (p6+p2)) + ((p5+p1) + (p7+p3))`. Eight interleaved sums are both more accurate than one
//! running sum and vectorizable.

use super::fp::{bf16_to_f32, f16_to_f32, read_f32, read_u16};
use super::types::GgmlType;
use super::x86::hsum_float_8;
use super::{iq4_nl, iq4_xs, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8, q8_k};

/// Dot product of blocks of `QK` elements, `bytes` each, dequantized by `deq`.
#[inline(always)]
fn dot_blocks<const QK: usize>(
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

/// Dot product of a weight row already dequantized to f32 (`w`, e.g. by [`super::dequantize_row`]) with `x`,
/// in the order of [`dot`]: element `i` into lane `i % 8` as a rounded product (no fma), the lanes combined by
/// `hsum_float_8`. Bit-identical to [`dot`] on the same row, since the dequantized values are the same: a
/// batched matmul dequantizes each weight row once and calls this for every token (the row's blocks are
/// not dequantized again per token).
#[inline]
pub(crate) fn dot_dequantized(w: &[f32], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above); the function only widens the vectors the compiler
        // may use for the same scalar mul/add sequence, so the bits are those of the portable build.
        return unsafe { dot_dequantized_avx2(w, x) };
    }
    dot_lanes8(w, x)
}

/// [`dot_lanes8`] compiled with AVX2 available: the eight lanes are one 256-bit register. Rust never
/// contracts `a * b + c` into an fma, so this computes the same bits as the portable build.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_dequantized_avx2(w: &[f32], x: &[f32]) -> f32 {
    dot_lanes8(w, x)
}

/// The eight-lane f32 dot of [`dot_dequantized`].
#[inline(always)]
fn dot_lanes8(w: &[f32], x: &[f32]) -> f32 {
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
fn dot_elems(w: &[u8], size: usize, x: &[f32], conv: impl Fn(&[u8]) -> f32) -> f32 {
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

/// Reference dot product of one weight row of `ty` with f32 `x`. `None` for types without a kernel.
///
/// Where the CPU has AVX2 the same code runs compiled with AVX2 enabled ([`dot_avx2`]): wider registers
/// for the dequantization and the eight lanes, the same operations in the same order, so the same bits.
#[inline]
pub(crate) fn dot(ty: GgmlType, w: &[u8], x: &[f32]) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { dot_avx2(ty, w, x) };
    }
    dot_portable(ty, w, x)
}

/// [`dot_portable`] compiled with AVX2 available (Rust never contracts `a * b + c` into an fma, so the bits
/// are the portable build's).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(ty: GgmlType, w: &[u8], x: &[f32]) -> Option<f32> {
    dot_portable(ty, w, x)
}

/// The body of [`dot`].
#[inline(always)]
fn dot_portable(ty: GgmlType, w: &[u8], x: &[f32]) -> Option<f32> {
    Some(match ty {
        GgmlType::F32 => dot_elems(w, 4, x, |b| read_f32(b, 0)),
        GgmlType::F16 => dot_elems(w, 2, x, |b| f16_to_f32(read_u16(b, 0))),
        GgmlType::BF16 => dot_elems(w, 2, x, |b| bf16_to_f32(read_u16(b, 0))),
        GgmlType::Q4_0 => dot_blocks(w, q4_0::BYTES, x, q4_0::dequantize_block),
        GgmlType::Q4_1 => dot_blocks(w, q4_1::BYTES, x, q4_1::dequantize_block),
        GgmlType::Q5_0 => dot_blocks(w, q5_0::BYTES, x, q5_0::dequantize_block),
        GgmlType::Q5_1 => dot_blocks(w, q5_1::BYTES, x, q5_1::dequantize_block),
        GgmlType::IQ4_NL => dot_blocks(w, iq4_nl::BYTES, x, iq4_nl::dequantize_block),
        GgmlType::Q2_K => dot_blocks(w, q2_k::BYTES, x, q2_k::dequantize_block),
        GgmlType::Q3_K => dot_blocks(w, q3_k::BYTES, x, q3_k::dequantize_block),
        GgmlType::Q5_K => dot_blocks(w, q5_k::BYTES, x, q5_k::dequantize_block),
        GgmlType::IQ4_XS => dot_blocks(w, iq4_xs::BYTES, x, iq4_xs::dequantize_block),
        GgmlType::Q8_0 => dot_blocks(w, q8::Q8_0_BYTES, x, q8::dequantize_block_q8_0),
        GgmlType::Q8_1 => dot_blocks(w, q8::Q8_1_BYTES, x, q8::dequantize_block_q8_1),
        GgmlType::Q4_K => dot_blocks(w, q4_k::BYTES, x, q4_k::dequantize_block),
        GgmlType::Q6_K => dot_blocks(w, q6_k::BYTES, x, q6_k::dequantize_block),
        GgmlType::Q8_K => dot_blocks(w, q8_k::BYTES, x, q8_k::dequantize_block),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 build of the reference dot product gives the portable build's bits, for every type with
    /// a reference quantizer (blocks from it) and lengths that are not a multiple of 8 for the floats.
    #[test]
    fn avx2_build_gives_the_portable_bits() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        for (ty, n) in [
            (GgmlType::Q4_0, 256),
            (GgmlType::Q4_1, 256),
            (GgmlType::Q5_0, 256),
            (GgmlType::Q8_0, 256),
            (GgmlType::Q8_K, 512),
            (GgmlType::F16, 45),
            (GgmlType::BF16, 45),
            (GgmlType::F32, 45),
        ] {
            for _ in 0..20 {
                let w: Vec<f32> = (0..n).map(|_| rnd()).collect();
                let x: Vec<f32> = (0..n).map(|_| rnd() * 4.0).collect();
                let blocks = super::super::quantize_row(ty, &w).unwrap();
                let a = dot(ty, &blocks, &x).unwrap();
                let b = dot_portable(ty, &blocks, &x).unwrap();
                assert_eq!(a.to_bits(), b.to_bits(), "{ty}");
            }
        }
    }
}
