//! AVX2 dequantization of whole rows for the block types reference mode reads most (Q4_0, Q4_1, Q5_0,
//! Q8_0, Q4_K, Q6_K): the values of each type's scalar `dequantize_block`, bit for bit — the same
//! operations in the same order on eight lanes (integer unpacking is exact, `i32 → f32` conversion of
//! these small integers is exact, and every `*`, `+`, `-` is the scalar one's single rounding: never an
//! fma). [`super::dequantize_row_with`] takes these under a SIMD setting ([`crate::Simd::Avx2`],
//! [`crate::Simd::Avx512`]) where the CPU has AVX2, the scalar code otherwise — and always under
//! [`crate::Simd::Off`].

use std::arch::x86_64::*;

use super::fp::read_f16;
use super::{q4_1, q4_k, q6_k, GgmlType};

/// Dequantizes `src` (whole blocks of `ty`) into `dst` with an AVX2 form of the type's
/// `dequantize_block`, if there is one and the CPU has AVX2; returns false (nothing written) otherwise.
/// Lengths are the caller's contract (checked by [`super::dequantize_row_with`], which calls this only
/// when its SIMD setting is not [`crate::Simd::Off`]).
pub(crate) fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
    if !crate::numerics::cpu_has("avx2") {
        return false;
    }
    // SAFETY: the CPU has AVX2 (checked above); every function reads whole blocks of `src` and writes
    // the matching elements of `dst` (checked with asserts inside).
    unsafe {
        match ty {
            GgmlType::Q4_0 => q4_0(src, dst),
            GgmlType::Q4_1 => q4_1(src, dst),
            GgmlType::Q5_0 => q5_0(src, dst),
            GgmlType::Q8_0 => q8_0(src, dst),
            GgmlType::Q4_K => q4_k(src, dst),
            GgmlType::Q6_K => q6_k(src, dst),
            _ => return false,
        }
    }
    true
}

/// The 32 low then high nibbles of 16 bytes at `p`, as bytes.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn nibbles(p: *const u8) -> (__m128i, __m128i) {
    let q = _mm_loadu_si128(p as *const __m128i);
    let m = _mm_set1_epi8(0x0F);
    (
        _mm_and_si128(q, m),
        _mm_and_si128(_mm_srli_epi16::<4>(q), m),
    )
}

/// Eight i32 from the bytes `8h .. 8h + 8` of `v` (signed when `SIGNED`, else unsigned) to f32.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn eight<const SIGNED: bool>(v: __m128i, h: usize) -> __m256 {
    let b = if h == 0 { v } else { _mm_srli_si128::<8>(v) };
    let i = if SIGNED {
        _mm256_cvtepi8_epi32(b)
    } else {
        _mm256_cvtepu8_epi32(b)
    };
    _mm256_cvtepi32_ps(i)
}

/// Sixteen bytes `v` (as `eight`) to f32, `f(value)` applied, stored at `out`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store16<const SIGNED: bool>(out: *mut f32, v: __m128i, f: impl Fn(__m256) -> __m256) {
    _mm256_storeu_ps(out, f(eight::<SIGNED>(v, 0)));
    _mm256_storeu_ps(out.add(8), f(eight::<SIGNED>(v, 1)));
}

/// `q4_0::dequantize_block`: `(q − 8) · d`.
#[target_feature(enable = "avx2")]
unsafe fn q4_0(src: &[u8], dst: &mut [f32]) {
    const B: usize = super::q4_0::BYTES;
    assert_eq!(src.len() / B * 32, dst.len());
    for (blk, out) in src.chunks_exact(B).zip(dst.chunks_exact_mut(32)) {
        let d = _mm256_set1_ps(read_f16(blk, 0));
        let (lo, hi) = nibbles(blk.as_ptr().add(2));
        let eight_ = _mm_set1_epi8(8);
        let (lo, hi) = (_mm_sub_epi8(lo, eight_), _mm_sub_epi8(hi, eight_));
        store16::<true>(out.as_mut_ptr(), lo, |v| _mm256_mul_ps(v, d));
        store16::<true>(out.as_mut_ptr().add(16), hi, |v| _mm256_mul_ps(v, d));
    }
}

/// `q4_1::dequantize_block`: `q · d + m`.
#[target_feature(enable = "avx2")]
unsafe fn q4_1(src: &[u8], dst: &mut [f32]) {
    const B: usize = q4_1::BYTES;
    assert_eq!(src.len() / B * 32, dst.len());
    let at = q4_1::min_offset();
    for (blk, out) in src.chunks_exact(B).zip(dst.chunks_exact_mut(32)) {
        let d = _mm256_set1_ps(read_f16(blk, 0));
        let m = _mm256_set1_ps(read_f16(blk, at));
        let (lo, hi) = nibbles(blk.as_ptr().add(4));
        let f = |v| _mm256_add_ps(_mm256_mul_ps(v, d), m);
        store16::<false>(out.as_mut_ptr(), lo, f);
        store16::<false>(out.as_mut_ptr().add(16), hi, f);
    }
}

/// Byte `j` of the result is 16 where bit `j` of `h` (bits 0..16) is set, else 0: byte `j / 8` of `h`
/// broadcast to byte `j`, tested against the bit `1 << (j % 8)` (integer operations, exact).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn high_bits(h: u32) -> __m128i {
    let spread = _mm_shuffle_epi8(
        _mm_cvtsi32_si128(h as i32),
        _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
    );
    let bit = _mm_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm_cmpeq_epi8(_mm_and_si128(spread, bit), bit);
    _mm_and_si128(set, _mm_set1_epi8(16))
}

/// `q5_0::dequantize_block`: `(q | h << 4) − 16`, times `d`.
#[target_feature(enable = "avx2")]
unsafe fn q5_0(src: &[u8], dst: &mut [f32]) {
    const B: usize = super::q5_0::BYTES;
    assert_eq!(src.len() / B * 32, dst.len());
    for (blk, out) in src.chunks_exact(B).zip(dst.chunks_exact_mut(32)) {
        let d = _mm256_set1_ps(read_f16(blk, 0));
        let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
        let (lo, hi) = nibbles(blk.as_ptr().add(6));
        // the fifth bit of element j is bit j of qh: spread it to bit 4 of byte j
        let sixteen = _mm_set1_epi8(16);
        let lo = _mm_sub_epi8(_mm_or_si128(lo, high_bits(qh)), sixteen);
        let hi = _mm_sub_epi8(_mm_or_si128(hi, high_bits(qh >> 16)), sixteen);
        store16::<true>(out.as_mut_ptr(), lo, |v| _mm256_mul_ps(v, d));
        store16::<true>(out.as_mut_ptr().add(16), hi, |v| _mm256_mul_ps(v, d));
    }
}

/// `q8::dequantize_block_q8_0`: `q · d`.
#[target_feature(enable = "avx2")]
unsafe fn q8_0(src: &[u8], dst: &mut [f32]) {
    const B: usize = super::q8::Q8_0_BYTES;
    assert_eq!(src.len() / B * 32, dst.len());
    for (blk, out) in src.chunks_exact(B).zip(dst.chunks_exact_mut(32)) {
        let d = _mm256_set1_ps(read_f16(blk, 0));
        for h in 0..2 {
            let q = _mm_loadu_si128(blk.as_ptr().add(2 + 16 * h) as *const __m128i);
            store16::<true>(out.as_mut_ptr().add(16 * h), q, |v| _mm256_mul_ps(v, d));
        }
    }
}

/// `q4_k::dequantize_block`: per 64 elements `c`, `d1 · q_lo − m1` then `d2 · q_hi − m2` with
/// `d1 = d · sc[2c]`, `m1 = min · m[2c]` (and `2c + 1`).
#[target_feature(enable = "avx2")]
unsafe fn q4_k(src: &[u8], dst: &mut [f32]) {
    const B: usize = q4_k::BYTES;
    assert_eq!(src.len() / B * 256, dst.len());
    for (blk, out) in src.chunks_exact(B).zip(dst.chunks_exact_mut(256)) {
        let d = read_f16(blk, 0);
        let min = read_f16(blk, 2);
        let (sc, m) = q4_k::scales_mins(&blk[4..16]);
        for c in 0..4 {
            let d1 = _mm256_set1_ps(d * f32::from(sc[2 * c]));
            let m1 = _mm256_set1_ps(min * f32::from(m[2 * c]));
            let d2 = _mm256_set1_ps(d * f32::from(sc[2 * c + 1]));
            let m2 = _mm256_set1_ps(min * f32::from(m[2 * c + 1]));
            let y = out.as_mut_ptr().add(64 * c);
            for h in 0..2 {
                let (lo, hi) = nibbles(blk.as_ptr().add(16 + 32 * c + 16 * h));
                store16::<false>(y.add(16 * h), lo, |v| {
                    _mm256_sub_ps(_mm256_mul_ps(d1, v), m1)
                });
                store16::<false>(y.add(32 + 16 * h), hi, |v| {
                    _mm256_sub_ps(_mm256_mul_ps(d2, v), m2)
                });
            }
        }
    }
}

/// `q6_k::dequantize_block`: `d · sc[i / 16] · (q − 32)`, the two products in that order.
#[target_feature(enable = "avx2")]
unsafe fn q6_k(src: &[u8], dst: &mut [f32]) {
    const B: usize = q6_k::BYTES;
    assert_eq!(src.len() / B * 256, dst.len());
    for (blk, out) in src.chunks_exact(B).zip(dst.chunks_exact_mut(256)) {
        let d = read_f16(blk, 208);
        let q = q6_k::quants(blk);
        let off = _mm_set1_epi8(32);
        for g in 0..16 {
            let ds = _mm256_set1_ps(d * f32::from(blk[192 + g] as i8));
            let v = _mm_sub_epi8(
                _mm_loadu_si128(q.as_ptr().add(16 * g) as *const __m128i),
                off,
            );
            store16::<true>(out.as_mut_ptr().add(16 * g), v, |x| _mm256_mul_ps(ds, x));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every type here gives the scalar `dequantize_block`'s bits on blocks of random bytes (every quant
    /// and scale pattern; the f16 fields set to finite values of either sign, including subnormal ones),
    /// with `-0.0`/`+0.0` told apart.
    #[test]
    fn avx2_rows_give_the_scalar_bits_on_random_blocks() {
        if !crate::numerics::cpu_has("avx2") {
            return;
        }
        let mut rng = crate::quant::test_rng::Rng(0x2545_f491_4f6c_dd1du64);
        let mut next = move || rng.next();
        // (type, block bytes, elements, offsets of f16 fields)
        for (ty, bytes, qk, f16_at) in [
            (GgmlType::Q4_0, super::super::q4_0::BYTES, 32, &[0usize][..]),
            (GgmlType::Q4_1, q4_1::BYTES, 32, &[0, 2][..]),
            (GgmlType::Q5_0, super::super::q5_0::BYTES, 32, &[0][..]),
            (GgmlType::Q8_0, super::super::q8::Q8_0_BYTES, 32, &[0][..]),
            (GgmlType::Q4_K, q4_k::BYTES, 256, &[0, 2][..]),
            (GgmlType::Q6_K, q6_k::BYTES, 256, &[208][..]),
        ] {
            for round in 0..200 {
                let nb = 3;
                let mut w: Vec<u8> = (0..nb * bytes).map(|_| next() as u8).collect();
                for b in 0..nb {
                    for &at in f16_at {
                        // finite: exponent below all-ones; every fourth round a subnormal scale
                        let mut h = (next() as u16) & 0xFBFF;
                        if round % 4 == 0 {
                            h &= 0x83FF;
                        }
                        w[b * bytes + at..b * bytes + at + 2].copy_from_slice(&h.to_le_bytes());
                    }
                }
                let mut want = vec![0f32; nb * qk];
                (super::super::table::traits(ty).unwrap().dequantize)(&w, &mut want);
                let mut got = vec![f32::NAN; nb * qk];
                assert!(dequantize_row(ty, &w, &mut got));
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), e.to_bits(), "{ty} element {i}");
                }
            }
        }
    }
}
