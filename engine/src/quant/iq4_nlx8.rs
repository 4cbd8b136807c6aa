//! The load-time repacked copy of IQ4_NL weights, eight rows interleaved (llama.cpp's `block_iq4_nlx8`,
//! ggml-cpu/repack.cpp `make_block_iq4_nlx8` with `blck_size_interleave = 8`), and the kernels that read
//! it for the repacked gemv and gemm ([`super::GgmlPath::RepackGemv`] / [`super::GgmlPath::RepackGemm`]:
//! `ggml_gemv_iq4_nl_8x8_q8_0` / `ggml_gemm_iq4_nl_8x8_q8_0`, arch/x86/repack.cpp, which run
//! `gemv_q4_b32_8x8_q8_0_lut_avx` / `gemm_q4_b32_8x8_q8_0_lut_avx` with the `kvalues_iq4nl` table).
//!
//! # Layout
//! An IQ4_NL block has Q4_0's layout (`d: f16`, 16 bytes of nibbles) and `make_block_iq4_nlx8` the
//! interleave of `make_block_q4_0x8` without the `^ 0x88` (the nibbles are table indices), so the copy
//! is [`super::q4_0x8::repack`]'s bytes: per group of eight rows and block, the eight f16 scales, then
//! sixteen chunks of 8 bytes, chunk `k` being bytes `8·(k / 8) ..` of row `k % 8`'s `qs`. It is derived
//! data, made once per matrix on first use (`models::weights::Weight`) and counted in the bench's peak RSS.
//!
//! # What the kernels compute
//! Per output and block the spec of `q4_0::dot_q8_0_repacked_lut` with `iq4_nl::KVALUES` (the gemm's
//! product): the exact integer dot `isum` of the 32 table values with the activation quants, then
//! `acc = fma(isum, d_w·d_x, acc)`, blocks in order on a single accumulator. The values are signed i8 in
//! `[−127, 113]` (`vpshufb` of the nibbles into the table). The AVX2 kernel ([`gemm`]) takes ggml's gemm
//! form `vpmaddubsw(|a|, sign(v, a))`: pairs at most 2·128·127 = 32 512, each widened by `vpmaddwd`
//! before any sum, so every step is exact for every activation quant (−128 too). The gemv's form
//! (`sign(a, v)`) wraps a −128 quant against a negative value; rows with such a quant
//! (`PreparedRow::has_min_quant`) are not given to these kernels on the gemv (the caller falls back).
//! The AVX-512 VNNI kernel ([`gemm_vnni`]) reads the table shifted by +128 (unsigned, `[1, 241]`),
//! sums `(v + 128)·a` with `vpdpbusd` in i32 and adds the per-block correction `−128·Σ a`
//! ([`corrections`]): the same integers.
//!
//! # Where they run
//! The backend (`CpuBackend::q4_0x8_for`) runs [`gemm`] for batches of two tokens or more on the `avx2`
//! setting: a decode step through the copy measured slower than the eight-row gemv on the file's layout,
//! and with AVX-512 the sixteen-row nibble tiles measured faster than [`gemm_vnni`] (issue 45), which
//! stays tested here for a later layout.

use super::q4_0x8::{GROUP_BLOCK_BYTES, ROWS};
use super::q8::QK;

/// The per-block sums of one activation row's quants times −128 (`−128·Σ a`, the correction that
/// turns the VNNI kernel's `Σ (v + 128)·a` into `Σ v·a`), `nb` of them into `out`.
pub(crate) fn corrections(qs: &[i8], nb: usize, out: &mut [i32]) {
    for (o, q) in out[..nb].iter_mut().zip(qs.chunks_exact(QK)) {
        *o = -128 * q.iter().map(|&v| i32::from(v)).sum::<i32>();
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use kernels::{gemm, gemm_vnni};

#[cfg(target_arch = "x86_64")]
mod kernels {
    use std::arch::x86_64::*;

    use super::super::iq4_nl::KVALUES;
    use super::super::q4_0x8::Act;
    use super::{GROUP_BLOCK_BYTES, QK, ROWS};

    /// Writes one kernel `$name` compiled for `$features`: with `$vnni`, each row's products of the
    /// shifted table values summed by `vpdpbusd` (then the correction), else by `vpmaddubsw` of the
    /// sign form and `vpmaddwd` (module docs). The same integers either way, so the same bits.
    macro_rules! group_kernel {
        ($name:ident, $features:literal, $vnni:literal, $doc:literal) => {
            #[doc = $doc]
            ///
            /// The outputs of the groups `packed` (whole groups of `nb` blocks, `q4_0x8::repack`'s
            /// layout) against every token of `acts`: `out(t)[8·g + r]` = row `8g + r`'s output for token
            /// `t`, the bits of `q4_0::dot_q8_0_repacked_lut` with `iq4_nl::KVALUES` (module docs; no
            /// activation with a −128 quant on the gemv). `acts[t].corr` is read by the VNNI kernel only
            /// ([`super::corrections`]). Groups outermost: a group's blocks are expanded to table values
            /// once for every token; `acc` holds the running sums of every token (`8 · acts.len()` floats,
            /// resized here).
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
                    assert!(a.qs.len() >= nb * QK && a.d.len() >= nb);
                    assert!(!$vnni || a.corr.len() >= nb);
                }
                let n_tok = acts.len();
                acc.clear();
                acc.resize(ROWS * n_tok, 0.0);
                let low = _mm256_set1_epi8(0x0F);
                let ones = _mm256_set1_epi16(1);
                let order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
                // the table in both 128-bit lanes (shifted by +128 for `vpdpbusd`'s unsigned operand)
                let shift: i8 = if $vnni { -128 } else { 0 };
                let table: [i8; 16] = std::array::from_fn(|i| KVALUES[i] ^ shift);
                let lut =
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
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
                        let val = |x: __m256i| _mm256_shuffle_epi8(lut, _mm256_and_si256(x, low));
                        // values: rows 0-3 (v0, v2) and rows 4-7 (v1, v3); low nibbles elements j and
                        // 8+j, high nibbles 16+j and 24+j of each row's quarter
                        let l0 = val(v[0]);
                        let h0 = val(_mm256_srli_epi16::<4>(v[0]));
                        let l1 = val(v[1]);
                        let h1 = val(_mm256_srli_epi16::<4>(v[1]));
                        let l2 = val(v[2]);
                        let h2 = val(_mm256_srli_epi16::<4>(v[2]));
                        let l3 = val(v[3]);
                        let h3 = val(_mm256_srli_epi16::<4>(v[3]));
                        for (t, a) in acts.iter().enumerate() {
                            let aq = a.qs.as_ptr().add(ib * QK) as *const i64;
                            // the token's elements 0-7, 8-15, 16-23, 24-31, each in every 64-bit lane
                            let b0 = _mm256_set1_epi64x(aq.read_unaligned());
                            let b1 = _mm256_set1_epi64x(aq.add(1).read_unaligned());
                            let b2 = _mm256_set1_epi64x(aq.add(2).read_unaligned());
                            let b3 = _mm256_set1_epi64x(aq.add(3).read_unaligned());
                            // i32 lanes 2q, 2q+1 of m03 belong to row q, of m47 to row 4+q
                            let (m03, m47, corr) = if $vnni {
                                let z = _mm256_setzero_si256();
                                let m03 =
                                    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(z, l0, b0), l2, b1);
                                let m03 =
                                    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(m03, h0, b2), h2, b3);
                                let m47 =
                                    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(z, l1, b0), l3, b1);
                                let m47 =
                                    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(m47, h1, b2), h3, b3);
                                (m03, m47, _mm256_set1_epi32(*a.corr.get_unchecked(ib)))
                            } else {
                                // ggml's gemm form: |a| unsigned, the value carrying a's sign
                                let (a0, a1) = (_mm256_sign_epi8(b0, b0), _mm256_sign_epi8(b1, b1));
                                let (a2, a3) = (_mm256_sign_epi8(b2, b2), _mm256_sign_epi8(b3, b3));
                                let p = |w: __m256i, b: __m256i, ab: __m256i| {
                                    _mm256_madd_epi16(
                                        _mm256_maddubs_epi16(ab, _mm256_sign_epi8(w, b)),
                                        ones,
                                    )
                                };
                                let m03 = _mm256_add_epi32(
                                    _mm256_add_epi32(p(l0, b0, a0), p(l2, b1, a1)),
                                    _mm256_add_epi32(p(h0, b2, a2), p(h2, b3, a3)),
                                );
                                let m47 = _mm256_add_epi32(
                                    _mm256_add_epi32(p(l1, b0, a0), p(l3, b1, a1)),
                                    _mm256_add_epi32(p(h1, b2, a2), p(h3, b3, a3)),
                                );
                                (m03, m47, _mm256_setzero_si256())
                            };
                            // hadd gives [r0 r1 r4 r5 | r2 r3 r6 r7]
                            let h = _mm256_hadd_epi32(m03, m47);
                            let isum =
                                _mm256_add_epi32(_mm256_permutevar8x32_epi32(h, order), corr);
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
        "The AVX2 kernel (`vpmaddubsw` of `|a|` and `sign(v, a)`, each pair widened by `vpmaddwd`)."
    );
    group_kernel!(
        gemm_vnni,
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        true,
        "The AVX-512 VNNI kernel (`vpdpbusd` of the +128-shifted values on 256-bit vectors, then the correction)."
    );
}

#[cfg(test)]
mod tests;
