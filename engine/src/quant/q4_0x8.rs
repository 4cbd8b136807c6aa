//! The load-time repacked copy of Q4_0 weights, eight rows interleaved (llama.cpp's `block_q4_0x8`,
//! ggml-cpu/repack.cpp `make_block_q4_0x8` with `blck_size_interleave = 8`), and the AVX2 kernels that
//! read it for the repacked gemv and gemm ([`super::GgmlPath::RepackGemv`] / [`super::GgmlPath::RepackGemm`]:
//! `ggml_gemv_q4_0_8x8_q8_0` / `ggml_gemm_q4_0_8x8_q8_0`, arch/x86/repack.cpp).
//!
//! # Layout
//! Rows `8g .. 8g+8` of a matrix become group `g`; a group holds, per block `ib` of 32 elements,
//! [`GROUP_BLOCK_BYTES`] = 144 bytes: the eight rows' f16 scales `d` (row `r` at bytes `2r`), then 128
//! bytes of nibbles in sixteen chunks of 8 bytes, chunk `k` being bytes `8·(k / 8) .. 8·(k / 8) + 8` of
//! row `k % 8`'s 16 bytes of `qs` — llama.cpp's interleave of eight. Unlike llama.cpp's copy the nibbles
//! keep the file's codes (llama.cpp stores `q ^ 0x88` for its sign-extending table; these kernels read
//! the codes unsigned). The file's bytes stay in the memory map; this copy is derived data, made once per
//! matrix on first use (`models::weights::Weight`) and counted in the bench's peak RSS.
//!
//! # What the kernels compute
//! Per output and block the spec of `q4_0::dot_q8_0_repacked`: the exact integer dot `isum` of the 32
//! values `q − 8` with the activation quants, then `acc = fma(isum, d_w·d_x, acc)`, blocks in order. Here
//! `isum = Σ q·a − 8·Σ a` with `q` the unsigned code: `vpmaddubsw(q, a)` pairs are at most 2·15·128, four of
//! them summed in i16 at most 15 360, so every step is exact for every activation quant (−128 too). That
//! is the gemm's product; the gemv's `sign` form differs from it only on a −128 quant (a NaN input), whose
//! rows these kernels are not given (`PreparedRow::has_min_quant`: the caller falls back). The eight rows of
//! a group sit in the eight f32 lanes of one accumulator, so no horizontal sum per row is needed. With
//! AVX-512 VNNI ([`gemm_vnni`]) `vpdpbusd` sums the products in i32 directly: the same integers.

use super::q4_0;
use super::q8::QK;

/// Rows interleaved in one group.
pub(crate) const ROWS: usize = 8;

/// Bytes of one block of one group: eight f16 scales and eight rows' 16 bytes of nibbles.
pub(crate) const GROUP_BLOCK_BYTES: usize = ROWS * q4_0::BYTES;

/// The repacked copy of a Q4_0 matrix of `rows` rows of `row_bytes` bytes (`data`, the file's blocks,
/// row-major): `rows / 8` groups of `row_bytes / 18` blocks (module docs), the same number of bytes.
///
/// # Panics
/// If `rows` is not a multiple of 8, `row_bytes` not a whole number of blocks or `data` shorter than
/// `rows · row_bytes`: a caller's bug (the caller checks [`packable`]).
pub(crate) fn repack(data: &[u8], rows: usize, row_bytes: usize) -> Vec<u8> {
    assert!(packable(rows, row_bytes) && data.len() >= rows * row_bytes);
    let nb = row_bytes / q4_0::BYTES;
    let mut out = vec![0u8; rows * row_bytes];
    for (g, group) in out.chunks_exact_mut(nb * GROUP_BLOCK_BYTES).enumerate() {
        for (ib, dst) in group.chunks_exact_mut(GROUP_BLOCK_BYTES).enumerate() {
            for r in 0..ROWS {
                let blk = &data[(g * ROWS + r) * row_bytes + ib * q4_0::BYTES..][..q4_0::BYTES];
                dst[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
                for half in 0..2 {
                    let k = half * ROWS + r;
                    let at = 2 * ROWS + 8 * k;
                    dst[at..at + 8].copy_from_slice(&blk[2 + 8 * half..2 + 8 * half + 8]);
                }
            }
        }
    }
    out
}

/// True if a Q4_0 matrix of `rows` rows of `row_bytes` bytes has a repacked copy: rows a positive
/// multiple of 8 (llama.cpp repacks Q4_0 only then) and whole blocks per row.
pub(crate) fn packable(rows: usize, row_bytes: usize) -> bool {
    rows > 0 && rows.is_multiple_of(ROWS) && row_bytes > 0 && row_bytes.is_multiple_of(q4_0::BYTES)
}

/// The per-block sums of one activation row's quants times −8 (`−8·Σ a`, the correction that turns
/// `Σ q·a` into `Σ (q − 8)·a`), `nb` of them into `out`.
pub(crate) fn corrections(qs: &[i8], nb: usize, out: &mut [i32]) {
    for (o, q) in out[..nb].iter_mut().zip(qs.chunks_exact(QK)) {
        *o = -8 * q.iter().map(|&v| i32::from(v)).sum::<i32>();
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use kernels::{gemm, gemm_vnni};

#[cfg(target_arch = "x86_64")]
mod kernels {
    use std::arch::x86_64::*;

    use super::super::q8::QK;
    use super::{GROUP_BLOCK_BYTES, ROWS};

    /// One token's activation in the form the kernel reads: the Q8_0 quants (`nb · 32`), per block the
    /// scale `d` and the correction `−8·Σ a` ([`super::corrections`]).
    #[derive(Clone, Copy)]
    pub(crate) struct Act<'a> {
        /// Quants, `nb · 32`.
        pub(crate) qs: &'a [i8],
        /// Per-block scales, `nb`.
        pub(crate) d: &'a [f32],
        /// Per-block `−8·Σ a`, `nb`.
        pub(crate) corr: &'a [i32],
    }

    /// Writes one kernel `$name` compiled for `$features`: with `$vnni`, each row's products summed by
    /// `vpdpbusd` (exact in i32), else by `vpmaddubsw` + `vpmaddwd` (exact: module docs). The same
    /// integers either way, so the same bits.
    macro_rules! group_kernel {
        ($name:ident, $features:literal, $vnni:literal, $doc:literal) => {
            #[doc = $doc]
            ///
            /// The outputs of the groups `packed` (whole groups of `nb` blocks, [`super::repack`]'s
            /// layout) against every token of `acts`: `out(t)[8·g + r]` = row `8g + r`'s output for token
            /// `t`, the bits of `q4_0::dot_q8_0_repacked` (module docs; no activation with a −128 quant on
            /// the gemv). Groups outermost: a group's blocks are expanded to codes once for every token;
            /// `acc` holds the running sums of every token (`8 · acts.len()` floats, resized here).
            ///
            /// # Safety
            /// The CPU must have the features enabled below. Shapes are checked.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn $name<'o>(
                packed: &[u8],
                nb: usize,
                acts: &[Act<'_>],
                acc: &mut Vec<f32>,
                mut out: impl FnMut(usize) -> &'o mut [f32],
            ) {
                let group_bytes = nb * GROUP_BLOCK_BYTES;
                assert!(nb > 0 && packed.len().is_multiple_of(group_bytes));
                let n_groups = packed.len() / group_bytes;
                for a in acts {
                    assert!(a.qs.len() >= nb * QK && a.d.len() >= nb && a.corr.len() >= nb);
                }
                let n_tok = acts.len();
                acc.clear();
                acc.resize(ROWS * n_tok, 0.0);
                let low = _mm256_set1_epi8(0x0F);
                let ones = _mm256_set1_epi16(1);
                let order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
                for g in 0..n_groups {
                    let base = packed.as_ptr().add(g * group_bytes);
                    for a in acc.iter_mut() {
                        *a = 0.0;
                    }
                    // one token (a decode step): its running sums stay in a register
                    let one = n_tok == 1;
                    let mut reg = _mm256_setzero_ps();
                    for ib in 0..nb {
                        let blk = base.add(ib * GROUP_BLOCK_BYTES);
                        let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
                        let q = blk.add(2 * ROWS);
                        let v: [__m256i; 4] = std::array::from_fn(|i| {
                            _mm256_loadu_si256(q.add(32 * i) as *const __m256i)
                        });
                        // codes: rows 0-3 (v0, v2) and rows 4-7 (v1, v3); low nibbles elements j and
                        // 8+j, high nibbles 16+j and 24+j of each row's quarter
                        let l0 = _mm256_and_si256(v[0], low);
                        let h0 = _mm256_and_si256(_mm256_srli_epi16::<4>(v[0]), low);
                        let l1 = _mm256_and_si256(v[1], low);
                        let h1 = _mm256_and_si256(_mm256_srli_epi16::<4>(v[1]), low);
                        let l2 = _mm256_and_si256(v[2], low);
                        let h2 = _mm256_and_si256(_mm256_srli_epi16::<4>(v[2]), low);
                        let l3 = _mm256_and_si256(v[3], low);
                        let h3 = _mm256_and_si256(_mm256_srli_epi16::<4>(v[3]), low);
                        for (t, a) in acts.iter().enumerate() {
                            let aq = a.qs.as_ptr().add(ib * QK) as *const i64;
                            // the token's elements 0-7, 8-15, 16-23, 24-31, each in every 64-bit lane
                            let b0 = _mm256_set1_epi64x(aq.read_unaligned());
                            let b1 = _mm256_set1_epi64x(aq.add(1).read_unaligned());
                            let b2 = _mm256_set1_epi64x(aq.add(2).read_unaligned());
                            let b3 = _mm256_set1_epi64x(aq.add(3).read_unaligned());
                            // i32 lanes 2q, 2q+1 of m03 belong to row q, of m47 to row 4+q
                            let (m03, m47) = if $vnni {
                                let z = _mm256_setzero_si256();
                                let m03 =
                                    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(z, l0, b0), l2, b1);
                                let m03 =
                                    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(m03, h0, b2), h2, b3);
                                let m47 =
                                    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(z, l1, b0), l3, b1);
                                let m47 =
                                    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(m47, h1, b2), h3, b3);
                                (m03, m47)
                            } else {
                                let s03 = _mm256_add_epi16(
                                    _mm256_add_epi16(
                                        _mm256_maddubs_epi16(l0, b0),
                                        _mm256_maddubs_epi16(l2, b1),
                                    ),
                                    _mm256_add_epi16(
                                        _mm256_maddubs_epi16(h0, b2),
                                        _mm256_maddubs_epi16(h2, b3),
                                    ),
                                );
                                let s47 = _mm256_add_epi16(
                                    _mm256_add_epi16(
                                        _mm256_maddubs_epi16(l1, b0),
                                        _mm256_maddubs_epi16(l3, b1),
                                    ),
                                    _mm256_add_epi16(
                                        _mm256_maddubs_epi16(h1, b2),
                                        _mm256_maddubs_epi16(h3, b3),
                                    ),
                                );
                                (_mm256_madd_epi16(s03, ones), _mm256_madd_epi16(s47, ones))
                            };
                            // hadd gives [r0 r1 r4 r5 | r2 r3 r6 r7]
                            let h = _mm256_hadd_epi32(m03, m47);
                            let isum = _mm256_add_epi32(
                                _mm256_permutevar8x32_epi32(h, order),
                                _mm256_set1_epi32(*a.corr.get_unchecked(ib)),
                            );
                            let d = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.get_unchecked(ib)));
                            if one {
                                reg = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, reg);
                            } else {
                                let p = acc.as_mut_ptr().add(ROWS * t);
                                let r = _mm256_fmadd_ps(
                                    _mm256_cvtepi32_ps(isum),
                                    d,
                                    _mm256_loadu_ps(p),
                                );
                                _mm256_storeu_ps(p, r);
                            }
                        }
                    }
                    if one {
                        _mm256_storeu_ps(acc.as_mut_ptr(), reg);
                    }
                    for t in 0..n_tok {
                        let o = out(t);
                        assert!(o.len() >= ROWS * (g + 1), "an output of every row");
                        o[ROWS * g..ROWS * (g + 1)].copy_from_slice(&acc[ROWS * t..ROWS * (t + 1)]);
                    }
                }
            }
        };
    }

    group_kernel!(
        gemm,
        "avx2,fma,f16c",
        false,
        "The AVX2 kernel (`vpmaddubsw` pairs summed in i16, then `vpmaddwd`)."
    );
    group_kernel!(
        gemm_vnni,
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        true,
        "The AVX-512 VNNI kernel (`vpdpbusd` on 256-bit vectors); the backend runs the copy with `avx2` only, as the `avx512` setting's nibble tiles measured faster (`CpuBackend::q4_0x8_for`)."
    );
}

#[cfg(target_arch = "x86_64")]
pub(crate) use kernels::Act;

#[cfg(test)]
mod tests;
