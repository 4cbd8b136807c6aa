//! Reference-mode dot products: dequantize each weight block to f32 (the same values
//! [`super::dequantize_row`] gives) and multiply-accumulate in f32 against the f32 activation.
//!
//! Accumulation order (fixed, documented so that results are reproducible): element `i` of the row is added
//! to partial sum `i % 8` as a rounded product (`lane += w * x`, no fma); the eight partial sums are combined
//! as `((p4+p0) + (p6+p2)) + ((p5+p1) + (p7+p3))`. Eight interleaved sums are both more accurate than one
//! running sum and vectorizable.

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

/// Dot product of a weight row already dequantized to f32 (`w`, e.g. by [`super::dequantize_row`]) with `x`,
/// in the order of [`dot`]: element `i` into lane `i % 8` as a rounded product (no fma), the lanes combined by
/// `hsum_float_8`. Bit-identical to [`dot`] on the same row, since the dequantized values are the same: a
/// batched matmul dequantizes each weight row once and calls this for every token (the row's blocks are
/// not dequantized again per token).
///
/// `simd`: the session runs SIMD kernels ([`crate::Simd::Off`] does not): the AVX2 build where the CPU has
/// it; otherwise the portable one. Same bits either way.
#[inline]
pub(crate) fn dot_dequantized(w: &[f32], x: &[f32], simd: bool) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
    #[cfg(target_arch = "x86_64")]
    if simd && std::arch::is_x86_feature_detected!("avx2") {
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

/// An explicit AVX2 + F16C form of a type's reference dot ([`vectors`]).
pub(crate) type VectorDot = unsafe fn(&[u8], &[f32]) -> f32;

/// Reference dot product of one weight row with f32 `x`: `portable` (the type's [`dot_blocks`] or
/// [`dot_elems`], `quant::table`) computes it.
///
/// With `simd` (the session runs SIMD kernels; [`crate::Simd::Off`] does not) and a CPU with AVX2, the
/// same code runs compiled with AVX2 enabled, or the type's explicit vector form `vectors` where it has
/// one and the CPU has F16C: the same operations in the same order, so the same bits. Without, the
/// portable build.
#[inline(always)]
pub(crate) fn dot(
    w: &[u8],
    x: &[f32],
    simd: bool,
    portable: impl Fn(&[u8], &[f32]) -> f32,
    vectors: Option<VectorDot>,
) -> f32 {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (simd, vectors);
    #[cfg(target_arch = "x86_64")]
    if simd && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { dot_avx2(w, x, portable, vectors) };
    }
    portable(w, x)
}

/// `portable` compiled with AVX2 available (Rust never contracts `a * b + c` into an fma, so the bits
/// are the portable build's), or `vectors` where the CPU has F16C.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(
    w: &[u8],
    x: &[f32],
    portable: impl Fn(&[u8], &[f32]) -> f32,
    vectors: Option<VectorDot>,
) -> f32 {
    // the 32-element block types the models ship most of their weights in, and the float types, with
    // explicit vectors (the compiler leaves their unpacking scalar); the others as compiled
    if let Some(v) = vectors {
        if std::arch::is_x86_feature_detected!("f16c") {
            // SAFETY: AVX2 (this function's contract) and F16C (checked above)
            return unsafe { v(w, x) };
        }
    }
    portable(w, x)
}

/// Explicit AVX2 + F16C forms of the portable reference dot ([`dot_blocks`], [`dot_elems`]) for Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL, F16 and BF16 rows,
/// with the same bits: each block's 32 values are made as the scalar `dequantize_block` makes them (an
/// exact i8 → f32 conversion, then `* d`, then `+ m` for Q4_1, one rounding each), and element `i` is added
/// to lane `i % 8` as the rounded product `w * x` (`_mm256_mul_ps` then `_mm256_add_ps`, never an fma); the
/// lanes are combined by `hsum_float_8`. f16 → f32 (`_mm256_cvtph_ps`) and bf16 → f32 (a 16-bit shift) are
/// exact.
#[cfg(target_arch = "x86_64")]
pub(crate) mod vectors {
    use std::arch::x86_64::*;

    use super::super::fp::read_f16;
    use super::super::x86::hsum_float_8;
    use super::super::{iq4_nl, q4_0, q4_1, q5_0, q8};

    /// Declares one explicit form per type: `$name(w, x)` = the portable reference dot of that type.
    macro_rules! forms {
        ($($(#[$doc:meta])* $name:ident($w:ident, $x:ident) => $body:expr;)*) => {$(
            $(#[$doc])*
            ///
            /// # Safety
            /// The CPU must have AVX2 and F16C.
            #[target_feature(enable = "avx2,f16c")]
            pub(crate) unsafe fn $name($w: &[u8], $x: &[f32]) -> f32 {
                $body
            }
        )*};
    }

    forms! {
        /// Q8_0 rows.
        q8_0(w, x) => blocks(w, q8::Q8_0_BYTES, x, |b| {
                (
                    std::array::from_fn(|j| b[2 + j] as i8),
                    read_f16(b, 0),
                    None,
                )
            });
        /// Q4_0 rows.
        q4_0(w, x) => blocks(w, q4_0::BYTES, x, |b| {
                let qs = &b[2..18];
                (
                    std::array::from_fn(|j| {
                        let q = if j < 16 {
                            qs[j] & 0x0F
                        } else {
                            qs[j - 16] >> 4
                        };
                        q as i8 - 8
                    }),
                    read_f16(b, 0),
                    None,
                )
            });
        /// Q4_1 rows.
        q4_1(w, x) => blocks(w, q4_1::BYTES, x, |b| {
                let qs = &b[4..20];
                (
                    std::array::from_fn(|j| {
                        (if j < 16 {
                            qs[j] & 0x0F
                        } else {
                            qs[j - 16] >> 4
                        }) as i8
                    }),
                    read_f16(b, 0),
                    Some(read_f16(b, q4_1::min_offset())),
                )
            });
        /// Q5_0 rows.
        q5_0(w, x) => blocks(w, q5_0::BYTES, x, |b| {
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let qs = &b[6..22];
                (
                    std::array::from_fn(|j| {
                        let q = if j < 16 {
                            qs[j] & 0x0F
                        } else {
                            qs[j - 16] >> 4
                        };
                        (q | (((qh >> j) & 1) << 4) as u8) as i8 - 16
                    }),
                    read_f16(b, 0),
                    None,
                )
            });
        /// IQ4_NL rows.
        iq4_nl(w, x) => blocks(w, iq4_nl::BYTES, x, |b| {
                let v = iq4_nl::values(&b[2..iq4_nl::BYTES]);
                (std::array::from_fn(|j| v[j] as i8), read_f16(b, 0), None)
            });
        /// F16 rows.
        f16(w, x) => elems(w, x, |p| _mm256_cvtph_ps(_mm_loadu_si128(p.cast())));
        /// BF16 rows.
        bf16(w, x) => elems(w, x, |p| {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            });
    }

    /// The lanes of `acc` combined as [`hsum_float_8`].
    #[inline(always)]
    unsafe fn hsum(acc: __m256) -> f32 {
        let mut a = [0f32; 8];
        _mm256_storeu_ps(a.as_mut_ptr(), acc);
        hsum_float_8(&a)
    }

    /// Blocks of 32 elements, `bytes` each: `unpack` gives the block's 32 integer values, its scale `d` and
    /// its min `m` (value `q * d`, or `q * d + m`).
    #[inline(always)]
    unsafe fn blocks(
        w: &[u8],
        bytes: usize,
        x: &[f32],
        unpack: impl Fn(&[u8]) -> ([i8; 32], f32, Option<f32>),
    ) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (blk, xs) in w.chunks_exact(bytes).zip(x.chunks_exact(32)) {
            let (q, d, m) = unpack(blk);
            let dv = _mm256_set1_ps(d);
            for c in 0..4 {
                let qi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().add(8 * c).cast()));
                let mut wv = _mm256_mul_ps(_mm256_cvtepi32_ps(qi), dv);
                if let Some(m) = m {
                    wv = _mm256_add_ps(wv, _mm256_set1_ps(m));
                }
                let xv = _mm256_loadu_ps(xs.as_ptr().add(8 * c));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(wv, xv));
            }
        }
        hsum(acc)
    }

    /// 2-byte float elements: `conv` widens the eight at a pointer; the tail (`x.len() % 8`) goes to lanes
    /// `0..` as in the portable code.
    #[inline(always)]
    unsafe fn elems(w: &[u8], x: &[f32], conv: impl Fn(*const u8) -> __m256) -> f32 {
        let full = x.len() / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        for i in (0..full).step_by(8) {
            let wv = conv(w[2 * i..2 * i + 16].as_ptr());
            acc = _mm256_add_ps(acc, _mm256_mul_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i))));
        }
        let mut a = [0f32; 8];
        _mm256_storeu_ps(a.as_mut_ptr(), acc);
        if full < x.len() {
            let mut wt = [0u8; 16];
            wt[..2 * (x.len() - full)].copy_from_slice(&w[2 * full..2 * x.len()]);
            let mut t = [0f32; 8];
            _mm256_storeu_ps(t.as_mut_ptr(), conv(wt.as_ptr()));
            for (k, &xi) in x[full..].iter().enumerate() {
                a[k] += t[k] * xi;
            }
        }
        hsum_float_8(&a)
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::traits;
    use super::super::types::GgmlType;
    use super::super::{iq4_nl, q4_0, q4_1, q5_0, q8};

    /// The reference dot of `ty` with (`simd`) and without the AVX2 build.
    fn dot(ty: GgmlType, w: &[u8], x: &[f32], simd: bool) -> Option<f32> {
        Some((traits(ty)?.dot.as_ref()?.reference)(w, x, simd))
    }
    fn dot_portable(ty: GgmlType, w: &[u8], x: &[f32]) -> Option<f32> {
        dot(ty, w, x, false)
    }

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
            (GgmlType::Q4_K, 512),
            (GgmlType::F16, 45),
            (GgmlType::BF16, 45),
            (GgmlType::F32, 45),
        ] {
            for _ in 0..20 {
                let w: Vec<f32> = (0..n).map(|_| rnd()).collect();
                let x: Vec<f32> = (0..n).map(|_| rnd() * 4.0).collect();
                let blocks = super::super::quantize_row(ty, &w).unwrap();
                let a = dot(ty, &blocks, &x, true).unwrap();
                let b = dot_portable(ty, &blocks, &x).unwrap();
                assert_eq!(a.to_bits(), b.to_bits(), "{ty}");
            }
        }
    }

    /// The same on blocks of random bytes (every quant and high-bit pattern, not only what a quantizer
    /// writes), with the f16 scale fields set to finite values of either sign, for the types with explicit
    /// vector forms; F16/BF16 rows of random finite values at lengths with and without a tail.
    #[test]
    fn vector_forms_give_the_portable_bits_on_random_blocks() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
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
                let a = dot(ty, &w, &x, true).unwrap();
                let b = dot_portable(ty, &w, &x).unwrap();
                assert_eq!(a.to_bits(), b.to_bits(), "{ty}");
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
                let a = dot(ty, &w, &x, true).unwrap();
                let b = dot_portable(ty, &w, &x).unwrap();
                assert_eq!(a.to_bits(), b.to_bits(), "{ty} n={n}");
            }
        }
    }
}
