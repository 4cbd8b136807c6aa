//! AVX2 + FMA kernels: ggml-cpu's x86 dot products written with the same intrinsics, so that ggml mode
//! with SIMD on gives the same bits as the scalar replicas in the per-format modules (and as llama.cpp).
//!
//! Each kernel is the AVX2 branch of its namesake in ggml-cpu's `arch/x86/quants.c`, instruction for
//! instruction where the order of rounding shows: the eight f32 lanes of one `__m256` accumulator, one
//! `_mm256_fmadd_ps` per 32-element block, `hsum_float_8` at the end. Integer steps (`maddubs`, `madd`)
//! are exact for every input a quant block can hold, so ggml's VNNI variants (`dpbusd`) give the same
//! lanes. The `_xN` variants compute `N` activation rows against one weight row at once (the weight's
//! nibbles are unpacked once); each of the `N` results is computed with exactly the single-row steps.
//!
//! Every function here is `unsafe`: the caller must have checked [`available`] (the
//! [`crate::simd::Simd`] selection does), and the slices must hold whole blocks of matching length (the
//! same contract as the scalar kernels, `debug_assert`ed there).

use std::arch::x86_64::*;

use super::fp::read_f16;
use super::q4_1;
use super::q8::{Q8_0_BYTES, QK};

/// True if this CPU runs the kernels of this module (AVX2, FMA and F16C, detected at run time).
pub fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// `hsum_float_8` (arch/x86/quants.c): high + low 128 bits, `movehl`, `movehdup` + `add_ss`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum_float_8(x: __m256) -> f32 {
    let mut res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}

/// `mul_sum_us8_pairs_float` (AVX2 branch): unsigned × signed bytes, pairs to i16 (`maddubs`), pairs of
/// those to i32 (`madd` with ones), to f32: lane `l` = the dot of bytes `4l .. 4l+4`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)))
}

/// `mul_sum_i8_pairs_float` (AVX2 branch): `|x|` and `sign(y, x)` with `_mm256_sign_epi8`, then
/// [`mul_sum_us8_pairs_float`].
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    mul_sum_us8_pairs_float(ax, sy)
}

/// `bytes_from_nibbles_32`: 16 bytes of packed nibbles → 32 bytes, low nibbles first.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn bytes_from_nibbles_32(qs: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(qs as *const __m128i);
    let bytes = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    _mm256_and_si256(_mm256_set1_epi8(0x0F), bytes)
}

/// Two consecutive little-endian f16 at `p` widened to f32 with one F16C `vcvtph2ps` (ggml's
/// `GGML_CPU_FP16_TO_FP32` on x86 is `_cvtsh_ss`, the same exact conversion; NaNs come out quiet, as from
/// [`read_f16`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f16x2(p: *const u8) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1)))
}

/// One f16 at `p` (see [`f16x2`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f16x1(p: *const u8) -> f32 {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
        (p as *const u16).read_unaligned(),
    )));
    _mm_cvtss_f32(v)
}

/// One activation row in Q8_0/Q8_1 form as the kernels read it: quants, per-block `d`, and (Q8_1) the
/// per-block `s`.
#[derive(Clone, Copy)]
pub(crate) struct Q8Row<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
}

/// `ggml_vec_dot_q4_1_q8_1`, AVX2 branch, for `R` Q4_1 weight rows against `N` activation rows (the
/// `R·N` independent accumulator chains run interleaved, which the one-row loop's fma latency would
/// otherwise serialise). Per block and pair: `summs += m_w * s_x` (contracted to an fma, as gcc does),
/// `acc = fma(d_w * d_x, mul_sum_us8_pairs_float(nibbles, q8), acc)`; result `hsum_float_8(acc) + summs`.
/// Every output has the bits of [`q4_1::dot_q8_1`] for its pair.
///
/// # Safety
/// [`available`] must be true; every `w` row holds `nb` Q4_1 blocks and every activation row `nb` Q8_1
/// blocks (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_1_q8_1<const R: usize, const N: usize>(
    w: [&[u8]; R],
    x: [Q8Row<'_>; N],
) -> [[f32; N]; R] {
    let nb = w[0].len() / q4_1::BYTES;
    for r in &w {
        assert_eq!(r.len(), nb * q4_1::BYTES);
    }
    for r in &x {
        assert!(r.qs.len() >= nb * QK && r.d.len() >= nb && r.s.len() >= nb);
    }
    let m_at = q4_1::min_offset();
    let mut acc = [[_mm256_setzero_ps(); N]; R];
    let mut summs = [[0f32; N]; R];
    for ib in 0..nb {
        for k in 0..R {
            let blk = w[k].as_ptr().add(ib * q4_1::BYTES);
            let (dw, m2) = f16x2(blk);
            let mw = if m_at == 2 {
                m2
            } else {
                read_f16(std::slice::from_raw_parts(blk, 4), m_at)
            };
            let qx = bytes_from_nibbles_32(blk.add(4));
            for j in 0..N {
                let r = &x[j];
                summs[k][j] = mw.mul_add(*r.s.get_unchecked(ib), summs[k][j]);
                let d = _mm256_set1_ps(dw * *r.d.get_unchecked(ib));
                let qy = _mm256_loadu_si256(r.qs.as_ptr().add(ib * QK) as *const __m256i);
                let xy = mul_sum_us8_pairs_float(qx, qy);
                acc[k][j] = _mm256_fmadd_ps(d, xy, acc[k][j]);
            }
        }
    }
    let mut out = [[0f32; N]; R];
    for k in 0..R {
        for j in 0..N {
            out[k][j] = hsum_float_8(acc[k][j]) + summs[k][j];
        }
    }
    out
}

/// `ggml_vec_dot_q8_0_q8_0`, AVX2 branch (and `tinyBLAS_Q0_AVX`, which computes each output the same
/// way), for `R` Q8_0 weight rows against `N` activation rows: per block and pair `acc = fma(d_w * d_x,
/// mul_sum_i8_pairs_float(q_w, q_x), acc)`, result `hsum_float_8(acc)`. Every output has the bits of
/// [`super::q8::dot_q8_0_q8_0`] (its exact `_mm256_sign_epi8` form included).
///
/// # Safety
/// [`available`] must be true; every `w` row holds `nb` Q8_0 blocks and every activation row `nb` Q8_0
/// blocks (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q8_0_q8_0<const R: usize, const N: usize>(
    w: [&[u8]; R],
    x: [Q8Row<'_>; N],
) -> [[f32; N]; R] {
    let nb = w[0].len() / Q8_0_BYTES;
    for r in &w {
        assert_eq!(r.len(), nb * Q8_0_BYTES);
    }
    for r in &x {
        assert!(r.qs.len() >= nb * QK && r.d.len() >= nb);
    }
    let mut acc = [[_mm256_setzero_ps(); N]; R];
    for ib in 0..nb {
        for k in 0..R {
            let blk = w[k].as_ptr().add(ib * Q8_0_BYTES);
            let dw = f16x1(blk);
            let qx = _mm256_loadu_si256(blk.add(2) as *const __m256i);
            for j in 0..N {
                let r = &x[j];
                let d = _mm256_set1_ps(dw * *r.d.get_unchecked(ib));
                let qy = _mm256_loadu_si256(r.qs.as_ptr().add(ib * QK) as *const __m256i);
                let q = mul_sum_i8_pairs_float(qx, qy);
                acc[k][j] = _mm256_fmadd_ps(d, q, acc[k][j]);
            }
        }
    }
    let mut out = [[0f32; N]; R];
    for k in 0..R {
        for j in 0..N {
            out[k][j] = hsum_float_8(acc[k][j]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    //! Each SIMD kernel against its scalar replica, in the style of llama.cpp's test-backend-ops: many
    //! shapes, random block bytes (any f16 scale bit pattern: NaN, infinities, subnormals) and
    //! activations quantized by ggml mode's own `from_float`, NaN inputs included.
    use super::super::{simd_kernel, vec_dot_path, GgmlPath, GgmlType, NumericsMode, PreparedRow};
    use crate::simd::Simd;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn activation(&mut self) -> f32 {
            let u = (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            match self.next() % 512 {
                0 => f32::NAN,
                1..=8 => u * 30.0,
                _ => u,
            }
        }
    }

    /// Random block bytes whose f16 scales are random bit patterns half of the time and ordinary
    /// magnitudes otherwise (so that most results are finite and every rounding shows).
    fn weight_row(ty: GgmlType, nb: usize, rng: &mut Rng) -> Vec<u8> {
        let bytes = ty.bytes_for((nb * ty.block_size()) as u64).unwrap();
        let per = bytes / nb;
        let mut w: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
        for blk in w.chunks_exact_mut(per) {
            if rng.next() % 2 == 0 {
                let d = half::f16::from_f32(((rng.next() % 1000) as f32 + 1.0) * 1e-5);
                blk[0..2].copy_from_slice(&d.to_le_bytes());
                if ty == GgmlType::Q4_1 {
                    let m = half::f16::from_f32(-((rng.next() % 1000) as f32) * 1e-4);
                    blk[2..4].copy_from_slice(&m.to_le_bytes());
                }
            }
        }
        w
    }

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn simd_kernels_give_the_scalar_kernels_bits() {
        if !super::available() {
            eprintln!("skipping: this CPU has no AVX2+FMA+F16C (the scalar path is the only one)");
            return;
        }
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        let mut cases = 0;
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let k = simd_kernel(Simd::Avx2, ty, NumericsMode::Ggml, GgmlPath::VecDot)
                .expect("a SIMD kernel for this type");
            for nb in (1..=24).chain([36, 48, 64, 96, 192]) {
                let n = nb * 32;
                for _ in 0..8 {
                    let w = weight_row(ty, nb, &mut rng);
                    let xs: Vec<PreparedRow> = (0..4)
                        .map(|_| {
                            let x: Vec<f32> = (0..n).map(|_| rng.activation()).collect();
                            let mut p = PreparedRow::new();
                            p.prepare(ty, NumericsMode::Ggml, &x).unwrap();
                            p
                        })
                        .collect();
                    let want: Vec<f32> = xs
                        .iter()
                        .map(|p| vec_dot_path(ty, &w, p, GgmlPath::VecDot))
                        .collect();
                    let four = k.dot([&w], [&xs[0], &xs[1], &xs[2], &xs[3]])[0];
                    // the same row three times in a 3-row call: each copy gives the same bits (a NaN's
                    // sign and payload are not part of the contract)
                    let rows3 = k.dot([&w, &w, &w], [&xs[0], &xs[1], &xs[2], &xs[3]]);
                    for r in rows3 {
                        for (a, b) in r.iter().zip(&four) {
                            assert!(same(*a, *b), "{ty} nb {nb}: 3-row {a:e} vs 1-row {b:e}");
                        }
                    }
                    for j in 0..4 {
                        let one = k.dot([&w], [&xs[j]])[0][0];
                        assert!(
                            same(one, want[j]) && same(four[j], want[j]),
                            "{ty} nb {nb} row {j}: scalar {:e} ({:#x}), simd x1 {:e}, simd x4 {:e}",
                            want[j],
                            want[j].to_bits(),
                            one,
                            four[j]
                        );
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > 1000);
    }

    #[test]
    fn no_simd_kernel_outside_ggml_mode_vec_dot() {
        assert_eq!(
            simd_kernel(
                Simd::Off,
                GgmlType::Q4_1,
                NumericsMode::Ggml,
                GgmlPath::VecDot
            ),
            None
        );
        assert_eq!(
            simd_kernel(
                Simd::Avx2,
                GgmlType::Q4_1,
                NumericsMode::Reference,
                GgmlPath::VecDot
            ),
            None
        );
    }
}
