//! Reference mode's few-token matmuls (decode) with AVX-512: each weight block dequantized in registers
//! and multiplied into the 16-lane accumulators at once, instead of dequantizing whole rows to memory and
//! reading them back (`reference_fma.rs`'s tiles, which batches of 8 tokens or more keep).
//!
//! The bits are the tiles' own: every block is dequantized with the operations of
//! `dequantize_simd.rs` (the scalar `dequantize_block`'s values, bit for bit: exact integer unpacking,
//! then the same single-rounding `*`, `+`, `-`, never fused), and element `k` of the row is fused into lane
//! `k % 16` in increasing `k`, the lanes reduced as `_mm512_reduce_add_ps` — the 16-lane order of
//! [`super::reference_fma`]. Blocks hold 32 or 256 elements, so a row is a whole number of 16-element
//! groups and there is no tail. Reference mode's bits therefore still do not depend on the batch size
//! (the tests below check these kernels against dequantization plus [`super::reference_fma::dot`]; the
//! engine's `reference_batch_dequantizes_once_with_the_per_token_bits` checks decode against prefill).

use super::GgmlType;

/// True when [`matmul`] has a kernel for weights of `ty` on this CPU (AVX-512 F; Q4_0, Q4_1, Q5_0, Q8_0,
/// Q4_K, Q6_K — the types `dequantize_simd.rs` unpacks).
pub(crate) fn supported(ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(
            ty,
            GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q8_0
                | GgmlType::Q4_K
                | GgmlType::Q6_K
        ) && crate::numerics::cpu_has("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        false
    }
}

/// Every product of the weight rows in `w` (`w.len() / row_bytes` rows of `ty`, `cols` elements each)
/// with the activation rows `xs` (each at least `cols` f32): `put(r, t, Σ_k w_r[k] · xs[t][k])` in the
/// 16-lane order, the bits of [`super::reference_fma::matmul`] on the dequantized rows. Four rows at a
/// time (four independent accumulator chains), one token at a time.
///
/// # Panics
/// If [`supported`] is false for `ty`, `row_bytes` is not `ty`'s size of `cols` elements, `w` is not a
/// whole number of rows, or an activation row is shorter than `cols` (the caller's contract).
pub(crate) fn matmul(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    cols: usize,
    xs: &[&[f32]],
    mut put: impl FnMut(usize, usize, f32),
) {
    assert!(supported(ty), "no fused reference kernel for {ty}");
    assert_eq!(
        ty.bytes_for(cols as u64),
        Some(row_bytes),
        "{ty}: rows of {cols}"
    );
    assert!(row_bytes > 0 && w.len().is_multiple_of(row_bytes));
    assert!(
        xs.iter().all(|x| x.len() >= cols),
        "activation rows of {cols}"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `supported` checked AVX-512 F and the type; the lengths are checked above.
    unsafe {
        x86::matmul(ty, w, row_bytes, cols, xs, &mut put)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::dequantize_simd::{high_bits, nibbles};
    use super::super::fp::read_f16;
    use super::super::x86::reduce_add_16;
    use super::super::{q4_1, q4_k, q6_k, GgmlType};

    /// Sixteen signed (`_mm512_cvtepi8_epi32`) or unsigned bytes to f32 (exact).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn widen<const SIGNED: bool>(v: __m128i) -> __m512 {
        let i = if SIGNED {
            _mm512_cvtepi8_epi32(v)
        } else {
            _mm512_cvtepu8_epi32(v)
        };
        _mm512_cvtepi32_ps(i)
    }

    /// Declares `$name::<R>(rows, x, n_blocks) -> [f32; R]`: `R` rows of blocks of `$qk` elements
    /// (`$bytes` bytes) against one activation row, `$body` fusing one block at `$p` into `$acc` with the
    /// activations at `$x` (16-element groups in increasing order).
    macro_rules! fused {
        ($name:ident, $qk:expr, $bytes:expr, |$p:ident, $x:ident, $acc:ident| $body:block) => {
            #[target_feature(enable = "avx512f")]
            unsafe fn $name<const R: usize>(
                rows: [*const u8; R],
                x: *const f32,
                n_blocks: usize,
                ahead: usize,
            ) -> [f32; R] {
                let mut accs = [_mm512_setzero_ps(); R];
                for b in 0..n_blocks {
                    let $x = x.add(b * $qk);
                    for (row, $acc) in rows.iter().zip(accs.iter_mut()) {
                        // the same block `ahead` bytes on (the rows of the next tile) requested now: rows
                        // read a block from each in turn are an order the hardware prefetchers follow
                        // poorly. A prefetch past the matrix reads nothing and cannot fault.
                        let next = row.add(b * $bytes).wrapping_add(ahead);
                        let mut o = 0;
                        while o < $bytes {
                            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(o) as *const i8);
                            o += 64;
                        }
                        let $p = std::slice::from_raw_parts(row.add(b * $bytes), $bytes);
                        $body
                    }
                }
                let mut out = [0f32; R];
                for (o, a) in out.iter_mut().zip(accs) {
                    let mut l = [0f32; 16];
                    _mm512_storeu_ps(l.as_mut_ptr(), a);
                    *o = reduce_add_16(&l);
                }
                out
            }
        };
    }

    fused!(q4_0, 32, super::super::q4_0::BYTES, |blk, x, acc| {
        let d = _mm512_set1_ps(read_f16(blk, 0));
        let (lo, hi) = nibbles(blk.as_ptr().add(2));
        let eight = _mm_set1_epi8(8);
        for (g, q) in [_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight)]
            .into_iter()
            .enumerate()
        {
            let w = _mm512_mul_ps(widen::<true>(q), d);
            *acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x.add(16 * g)), *acc);
        }
    });

    fused!(q4_1, 32, q4_1::BYTES, |blk, x, acc| {
        let d = _mm512_set1_ps(read_f16(blk, 0));
        let m = _mm512_set1_ps(read_f16(blk, q4_1::min_offset()));
        let (lo, hi) = nibbles(blk.as_ptr().add(4));
        for (g, q) in [lo, hi].into_iter().enumerate() {
            let w = _mm512_add_ps(_mm512_mul_ps(widen::<false>(q), d), m);
            *acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x.add(16 * g)), *acc);
        }
    });

    fused!(q5_0, 32, super::super::q5_0::BYTES, |blk, x, acc| {
        let d = _mm512_set1_ps(read_f16(blk, 0));
        let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
        let (lo, hi) = nibbles(blk.as_ptr().add(6));
        let sixteen = _mm_set1_epi8(16);
        let lo = _mm_sub_epi8(_mm_or_si128(lo, high_bits(qh)), sixteen);
        let hi = _mm_sub_epi8(_mm_or_si128(hi, high_bits(qh >> 16)), sixteen);
        for (g, q) in [lo, hi].into_iter().enumerate() {
            let w = _mm512_mul_ps(widen::<true>(q), d);
            *acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x.add(16 * g)), *acc);
        }
    });

    fused!(q8_0, 32, super::super::q8::Q8_0_BYTES, |blk, x, acc| {
        let d = _mm512_set1_ps(read_f16(blk, 0));
        for g in 0..2 {
            let q = _mm_loadu_si128(blk.as_ptr().add(2 + 16 * g) as *const __m128i);
            let w = _mm512_mul_ps(widen::<true>(q), d);
            *acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x.add(16 * g)), *acc);
        }
    });

    fused!(q4_k, 256, q4_k::BYTES, |blk, x, acc| {
        let d = read_f16(blk, 0);
        let min = read_f16(blk, 2);
        let (sc, m) = q4_k::scales_mins(&blk[4..16]);
        for c in 0..4 {
            let d1 = _mm512_set1_ps(d * f32::from(sc[2 * c]));
            let m1 = _mm512_set1_ps(min * f32::from(m[2 * c]));
            let d2 = _mm512_set1_ps(d * f32::from(sc[2 * c + 1]));
            let m2 = _mm512_set1_ps(min * f32::from(m[2 * c + 1]));
            let (lo0, hi0) = nibbles(blk.as_ptr().add(16 + 32 * c));
            let (lo1, hi1) = nibbles(blk.as_ptr().add(16 + 32 * c + 16));
            // elements 64c.. : the low nibbles (scale 2c), then the high ones (scale 2c + 1)
            for (g, (q, dd, mm)) in [(lo0, d1, m1), (lo1, d1, m1), (hi0, d2, m2), (hi1, d2, m2)]
                .into_iter()
                .enumerate()
            {
                let w = _mm512_sub_ps(_mm512_mul_ps(dd, widen::<false>(q)), mm);
                *acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x.add(64 * c + 16 * g)), *acc);
            }
        }
    });

    fused!(q6_k, 256, q6_k::BYTES, |blk, x, acc| {
        let d = read_f16(blk, 208);
        let q = q6_k::quants(blk);
        let off = _mm_set1_epi8(32);
        for g in 0..16 {
            let ds = _mm512_set1_ps(d * f32::from(blk[192 + g] as i8));
            let v = _mm_sub_epi8(
                _mm_loadu_si128(q.as_ptr().add(16 * g) as *const __m128i),
                off,
            );
            let w = _mm512_mul_ps(ds, widen::<true>(v));
            *acc = _mm512_fmadd_ps(w, _mm512_loadu_ps(x.add(16 * g)), *acc);
        }
    });

    /// [`super::matmul`] for `ty`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; `ty` is one of the six types; `w` holds whole rows of `row_bytes` bytes of
    /// `cols` elements; every `xs[t]` holds at least `cols` f32.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn matmul(
        ty: GgmlType,
        w: &[u8],
        row_bytes: usize,
        cols: usize,
        xs: &[&[f32]],
        put: &mut impl FnMut(usize, usize, f32),
    ) {
        macro_rules! walk {
            ($k:ident, $qk:expr) => {{
                let n_blocks = cols / $qk;
                let n_rows = w.len() / row_bytes;
                let row = |r: usize| w.as_ptr().add(r * row_bytes);
                for (t, xt) in xs.iter().enumerate() {
                    let mut r = 0;
                    while r + 4 <= n_rows {
                        let o = $k::<4>(
                            std::array::from_fn(|i| row(r + i)),
                            xt.as_ptr(),
                            n_blocks,
                            4 * row_bytes,
                        );
                        for (i, v) in o.into_iter().enumerate() {
                            put(r + i, t, v);
                        }
                        r += 4;
                    }
                    for r in r..n_rows {
                        put(r, t, $k::<1>([row(r)], xt.as_ptr(), n_blocks, row_bytes)[0]);
                    }
                }
            }};
        }
        match ty {
            GgmlType::Q4_0 => walk!(q4_0, 32),
            GgmlType::Q4_1 => walk!(q4_1, 32),
            GgmlType::Q5_0 => walk!(q5_0, 32),
            GgmlType::Q8_0 => walk!(q8_0, 32),
            GgmlType::Q4_K => walk!(q4_k, 256),
            GgmlType::Q6_K => walk!(q6_k, 256),
            _ => unreachable!("checked by `supported`"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random rows of every type (f16 fields finite, every fifth a subnormal; quants every pattern),
    /// against dequantization ([`super::super::dequantize_row`]) plus the 16-lane dot
    /// ([`super::super::reference_fma::dot_scalar`]), bit for bit, with 1..7 rows (the four-row tiles and
    /// their remainder) and one to three tokens.
    #[test]
    fn fused_rows_give_the_dequantized_16_lane_bits() {
        let types = [
            (GgmlType::Q4_0, &[0usize][..]),
            (GgmlType::Q4_1, &[0, 2][..]),
            (GgmlType::Q5_0, &[0][..]),
            (GgmlType::Q8_0, &[0][..]),
            (GgmlType::Q4_K, &[0, 2][..]),
            (GgmlType::Q6_K, &[208][..]),
        ];
        if !supported(GgmlType::Q8_0) {
            return;
        }
        let mut rng = crate::quant::test_rng::Rng(0x9e37_79b9_7f4a_7c15u64);
        let mut next = move || rng.next();
        for (ty, f16_at) in types {
            let (qk, bytes) = (
                ty.block_size(),
                ty.bytes_for(ty.block_size() as u64).unwrap(),
            );
            for round in 0..40 {
                let n_blocks = 1 + round % 3;
                let cols = n_blocks * qk;
                let n_rows = 1 + round % 7;
                let rb = n_blocks * bytes;
                let mut w: Vec<u8> = (0..n_rows * rb).map(|_| next() as u8).collect();
                for b in 0..n_rows * n_blocks {
                    for &at in f16_at {
                        let mut h = (next() as u16) & 0xFBFF;
                        if round % 5 == 0 {
                            h &= 0x83FF;
                        }
                        w[b * bytes + at..b * bytes + at + 2].copy_from_slice(&h.to_le_bytes());
                    }
                }
                let xs: Vec<Vec<f32>> = (0..1 + round % 3)
                    .map(|_| {
                        (0..cols)
                            .map(|_| ((next() >> 40) as f32 / (1u64 << 23) as f32) - 1.0)
                            .collect()
                    })
                    .collect();
                let xr: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
                let mut got = vec![f32::NAN; n_rows * xs.len()];
                matmul(ty, &w, rb, cols, &xr, |r, t, v| got[t * n_rows + r] = v);
                let mut deq = vec![0f32; cols];
                for r in 0..n_rows {
                    super::super::dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut deq).unwrap();
                    for (t, x) in xs.iter().enumerate() {
                        let want = super::super::reference_fma::dot_scalar(&deq, x);
                        assert_eq!(
                            got[t * n_rows + r].to_bits(),
                            want.to_bits(),
                            "{ty} round {round} row {r} token {t}"
                        );
                    }
                }
            }
        }
    }
}
