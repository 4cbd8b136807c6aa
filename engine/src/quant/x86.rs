//! Scalar replicas of the SIMD steps whose rounding or NaN behaviour shows in ggml-cpu's x86 results.
//!
//! Every kernel in ggml-cpu's `arch/x86/quants.c` keeps eight f32 partial sums (one `__m256`), one per group
//! of four consecutive elements of a 32-element block, fused-multiply-adds each block's scaled integer lane
//! sums into them, and adds the eight lanes at the end with `hsum_float_8`. Repeating those exact steps in
//! scalar code (with `f32::mul_add` for `_mm256_fmadd_ps`) gives the same bits as the SIMD code; these are
//! the shared pieces.

/// `a * b + c` with one rounding, as `_mm256_fmadd_ps` computes a lane: the same value as `f32::mul_add`.
///
/// Without the `fma` target feature at compile time, `f32::mul_add` is a call into libm's `fmaf`, which
/// would dominate the ggml-mode kernels. Instead: the product of two f32 is exact in f64, so
/// `r = a*b + c` in f64 has one rounding, and `r as f32` is the correctly rounded fma unless that double
/// rounding matters — which can only happen when `r` lands exactly halfway between two f32 (low 29 bits of
/// the f64 fraction `1000…0`) or in f32's subnormal range. Those rare cases take `f32::mul_add`.
#[inline(always)]
pub(crate) fn fma(a: f32, b: f32, c: f32) -> f32 {
    if cfg!(target_feature = "fma") {
        return a.mul_add(b, c);
    }
    let r = f64::from(a) * f64::from(b) + f64::from(c);
    let halfway = r.to_bits() & 0x1FFF_FFFF == 0x1000_0000;
    let tiny = r != 0.0 && r.abs() < f64::from(f32::MIN_POSITIVE);
    if halfway || tiny {
        a.mul_add(b, c)
    } else {
        r as f32
    }
}

/// How a replica computes `a·b + c` with one rounding: [`Emulated`] (portable, [`fma`]) or [`Hardware`]
/// (`f32::mul_add`, one `vfmadd` instruction inside a `#[target_feature(enable = "fma")]` function; a libm
/// call elsewhere). Both give the same bits; the replicas in `ops::ggml_cpu` are generic over it so that
/// the SIMD setting can compile them with FMA and let them vectorize.
pub(crate) trait Fma: Copy {
    /// `a * b + c`, rounded once.
    fn fma(a: f32, b: f32, c: f32) -> f32;

    /// True for [`Hardware`]: the caller runs on a CPU with AVX2 and FMA, so code generic over `Fma` may
    /// call AVX2 kernels that compute the same fmas (`Hardware` is used only inside functions compiled
    /// with those features, on CPUs that have them).
    const AVX2: bool = false;

    /// True for [`HardwareAvx512`]: as [`Fma::AVX2`], and the CPU has AVX-512 F and VL too, so code
    /// generic over `Fma` may call kernels that use the 32 vector registers of AVX-512 (same fmas).
    const AVX512: bool = false;
}

/// [`fma`]: correct on any CPU, no FMA instruction needed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Emulated;

impl Fma for Emulated {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        fma(a, b, c)
    }
}

/// `f32::mul_add`: the FMA instruction where the caller enabled it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hardware;

impl Fma for Hardware {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }

    const AVX2: bool = true;
}

/// [`Hardware`] inside functions compiled with AVX-512 F and VL as well, on CPUs that have them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HardwareAvx512;

impl Fma for HardwareAvx512 {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }

    const AVX2: bool = true;
    const AVX512: bool = true;
}

/// `_mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc)`: the per-block update of every
/// x86 quant kernel. Same result as [`fma`] on each lane; written over all eight lanes so that the common
/// case (no lane needs the exact fallback) runs without branches per lane.
#[inline(always)]
pub(crate) fn fma_lanes(d: f32, lanes: &[i32; 8], acc: &mut [f32; 8]) {
    if cfg!(target_feature = "fma") {
        for (a, &l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
        return;
    }
    let mut r = [0f64; 8];
    let mut redo = false;
    for ((r, &l), &a) in r.iter_mut().zip(lanes).zip(acc.iter()) {
        // the i32 → f32 conversion rounds first (lanes can exceed 2^24), as _mm256_cvtepi32_ps does
        let v = f64::from(d) * f64::from(l as f32) + f64::from(a);
        redo |= (v.to_bits() & 0x1FFF_FFFF == 0x1000_0000)
            | (v != 0.0 && v.abs() < f64::from(f32::MIN_POSITIVE));
        *r = v;
    }
    if redo {
        for (a, &l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    } else {
        for (a, &r) in acc.iter_mut().zip(&r) {
            *a = r as f32;
        }
    }
}

/// One lane of `_mm_max_ps(a, b)` / `_mm256_max_ps(a, b)`: `a > b ? a : b`, so a NaN in either operand
/// yields `b`.
#[inline]
fn maxps(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// max |x| over a block of 32 as x86 `quantize_row_q8_0` / `quantize_row_q8_1` (arch/x86/quants.c, AVX
/// branch) compute it: lane-wise max of the four 8-wide vectors, then 8 → 4 → 2 → 1. Same value as a plain
/// max for NaN-free input; with NaNs, whether a NaN survives depends on its position, as in ggml.
pub(crate) fn block_absmax_avx(x: &[f32]) -> f32 {
    debug_assert_eq!(x.len(), 32);
    let mut m = [0f32; 8];
    for (l, m) in m.iter_mut().enumerate() {
        let mut v = x[l].abs();
        v = maxps(v, x[8 + l].abs());
        v = maxps(v, x[16 + l].abs());
        v = maxps(v, x[24 + l].abs());
        *m = v;
    }
    // _mm_max_ps(extract_hi, cast_lo)
    let m4 = [
        maxps(m[4], m[0]),
        maxps(m[5], m[1]),
        maxps(m[6], m[2]),
        maxps(m[7], m[3]),
    ];
    // _mm_max_ps(max4, movehl(max4, max4))
    let m2 = [maxps(m4[0], m4[2]), maxps(m4[1], m4[3])];
    // _mm_max_ss(max4, movehdup(max4))
    maxps(m2[0], m2[1])
}

/// `_mm256_round_ps(v, _MM_ROUND_NEAREST)` (round half to even) then `_mm256_cvtps_epi32`: NaN and values
/// outside i32 give `INT32_MIN` ("integer indefinite").
#[inline]
pub(crate) fn round_even_cvt_i32(v: f32) -> i32 {
    // |v| < 2^22: adding and removing 1.5·2^23 rounds to an integer, to even on ties (the default
    // rounding mode), without the libm `rintf` call `round_ties_even` becomes without SSE4.1
    if v.abs() < 4_194_304.0 {
        return ((v + 12_582_912.0) - 12_582_912.0) as i32;
    }
    let r = v.round_ties_even();
    if r.is_nan() || !(-2147483648.0..2147483648.0).contains(&r) {
        i32::MIN
    } else {
        r as i32
    }
}

/// `_mm256_packs_epi32` then `_mm256_packs_epi16`: saturate an i32 to i8.
#[inline]
pub(crate) fn saturate_i8(v: i32) -> i8 {
    v.clamp(-128, 127) as i8
}

/// `hsum_float_8` (arch/x86/quants.c; also `hsum(__m256)` in llamafile/sgemm.cpp): high half + low half,
/// then `movehl`, then `movehdup`: `((a4+a0) + (a6+a2)) + ((a5+a1) + (a7+a3))`.
#[inline]
pub(crate) fn hsum_float_8(a: &[f32; 8]) -> f32 {
    let r = [a[4] + a[0], a[5] + a[1], a[6] + a[2], a[7] + a[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// The 4-lane tail of [`hsum_float_8`] (`movehl` + `movehdup`), as the Q4_K kernel reduces its `acc_m`.
#[inline]
pub(crate) fn hsum_float_4(a: &[f32; 4]) -> f32 {
    (a[0] + a[2]) + (a[1] + a[3])
}

/// gcc's `_mm512_reduce_add_ps`: 16 → 8 (high + low 256 bits) → 4 → (0+2, 1+3) → 1.
#[inline]
pub(crate) fn reduce_add_16(a: &[f32; 16]) -> f32 {
    let mut t8 = [0f32; 8];
    for (i, t) in t8.iter_mut().enumerate() {
        *t = a[8 + i] + a[i];
    }
    let t4 = [t8[4] + t8[0], t8[5] + t8[1], t8[6] + t8[2], t8[7] + t8[3]];
    hsum_float_4(&t4)
}

/// [`reduce_add_16`] in registers, on a 16-lane sum held as two 8-lane halves (`lo`: lanes 0..8, `hi`:
/// 8..16): the same additions in the same order (GCC's `_mm512_reduce_add_ps`: `vextractf`, `vaddps`
/// 256 then 128 bits, `movhlps` + `addps`, `movshdup` + `addss`), without the round trip through memory
/// that the tiles' per-output reductions otherwise pay. Same bits as [`reduce_add_16`] (a NaN's payload
/// aside).
///
/// # Safety
/// The CPU must have AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
pub(crate) unsafe fn reduce_add_16_halves(
    lo: std::arch::x86_64::__m256,
    hi: std::arch::x86_64::__m256,
) -> f32 {
    use std::arch::x86_64::*;
    let t8 = _mm256_add_ps(hi, lo);
    let t4 = _mm_add_ps(_mm256_extractf128_ps::<1>(t8), _mm256_castps256_ps128(t8));
    let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)))
}

/// [`reduce_add_16`] of a `__m512` in registers ([`reduce_add_16_halves`] of its two halves).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn reduce_add_16_512(v: std::arch::x86_64::__m512) -> f32 {
    use std::arch::x86_64::*;
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    reduce_add_16_halves(_mm512_castps512_ps256(v), hi)
}

/// [`reduce_add_16`] of sixteen `__m512` at once: `out[j]` is `reduce_add_16_512(v[j])`, the same
/// additions with the same operands in the same order, but done lane-parallel — each level of the tree
/// pairs the accumulators' halves with `vshuff32x4` / `vshufps` and adds sixteen lanes at a time (15
/// adds and 30 shuffles for 16 outputs, against ~9 instructions per output one by one):
///
/// 1. `hi256 + lo256` of two accumulators per add (`_mm256_add_ps(hi, lo)`);
/// 2. `hi128 + lo128` of four (`_mm_add_ps(extract hi, lo)`);
/// 3. `(l0 + l2, l1 + l3)` of eight (`movhlps` + `addps`);
/// 4. `l0 + l1` of sixteen (`movshdup` + `addss`).
///
/// After step 4, lane `4j + i` holds accumulator `4i + j`. Same bits as [`reduce_add_16`] (a NaN's
/// payload aside, as [`reduce_add_16_halves`]).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn reduce_add_16x16(v: &[std::arch::x86_64::__m512; 16]) -> [f32; 16] {
    use std::arch::x86_64::*;
    // 1: P_k = [s8(v[2k]) | s8(v[2k + 1])]
    let p: [__m512; 8] = std::array::from_fn(|k| {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0xEE>(a, b),
            _mm512_shuffle_f32x4::<0x44>(a, b),
        )
    });
    // 2: Q_m = [s4(v[4m]), s4(v[4m + 1]), s4(v[4m + 2]), s4(v[4m + 3])]
    let q: [__m512; 4] = std::array::from_fn(|m| {
        let (a, b) = (p[2 * m], p[2 * m + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0xDD>(a, b),
            _mm512_shuffle_f32x4::<0x88>(a, b),
        )
    });
    // 3: R_n, 128-bit chunk j = [s2(v[8n + j]), s2(v[8n + 4 + j])]
    let r: [__m512; 2] = std::array::from_fn(|n| {
        let (a, b) = (q[2 * n], q[2 * n + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(a, b),
            _mm512_shuffle_ps::<0xEE>(a, b),
        )
    });
    // 4: chunk j = [v[j], v[4 + j], v[8 + j], v[12 + j]]
    let s = _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(r[0], r[1]),
        _mm512_shuffle_ps::<0xDD>(r[0], r[1]),
    );
    let mut lanes = [0f32; 16];
    _mm512_storeu_ps(lanes.as_mut_ptr(), s);
    std::array::from_fn(|a| lanes[4 * (a % 4) + a / 4])
}

/// `out[r][t] = reduce_add_16_512(acc[r][t])` for a register tile's accumulators: sixteen at a time
/// through [`reduce_add_16x16`] (the last batch padded with zeros) when the tile has at least eight,
/// one by one otherwise. Same bits either way.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
// index loops on purpose: with iterators LLVM kept this out of line and slow (see the body's comment)
#[allow(clippy::needless_range_loop)]
pub(crate) unsafe fn reduce_tile_512<const R: usize, const T: usize>(
    acc: &[[std::arch::x86_64::__m512; T]; R],
) -> [[f32; T]; R] {
    use std::arch::x86_64::*;
    const { assert!(R * T <= 32) };
    let mut out = [[0f32; T]; R];
    if R * T < 8 {
        for r in 0..R {
            for t in 0..T {
                out[r][t] = reduce_add_16_512(acc[r][t]);
            }
        }
        return out;
    }
    // constant trip counts throughout, so that everything unrolls and stays in registers
    let mut flat = [_mm512_setzero_ps(); 32];
    for r in 0..R {
        for t in 0..T {
            flat[r * T + t] = acc[r][t];
        }
    }
    let lo = reduce_add_16x16(&[
        flat[0], flat[1], flat[2], flat[3], flat[4], flat[5], flat[6], flat[7], flat[8], flat[9],
        flat[10], flat[11], flat[12], flat[13], flat[14], flat[15],
    ]);
    let hi = if R * T > 16 {
        reduce_add_16x16(&[
            flat[16], flat[17], flat[18], flat[19], flat[20], flat[21], flat[22], flat[23],
            flat[24], flat[25], flat[26], flat[27], flat[28], flat[29], flat[30], flat[31],
        ])
    } else {
        [0f32; 16]
    };
    for r in 0..R {
        for t in 0..T {
            let i = r * T + t;
            out[r][t] = if i < 16 { lo[i] } else { hi[i - 16] };
        }
    }
    out
}

/// The eight i32 lanes of one 256-element super-block in the AVX2 K-quant kernels whose sub-blocks of 16
/// carry their own scale (`ggml_vec_dot_q2_K_q8_K`, `ggml_vec_dot_q3_K_q8_K`, arch/x86/quants.c): for half
/// `h` and 32-element group `k`, lane `l` adds `sc(8h + 2k + l/4) · Σ v[e]·qy[e]` over elements
/// `4l .. 4l + 4` of the group, wrapping as the kernels' i32 lanes do. `v`, `qy`: `[256]`.
pub(crate) fn scaled_lanes_16<T: Copy + Into<i32>>(
    v: &[T],
    qy: &[i8],
    sc: impl Fn(usize) -> i32,
) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for h in 0..2 {
        for k in 0..4 {
            let base = 128 * h + 32 * k;
            for (l, lane) in lanes.iter_mut().enumerate() {
                let mut p = 0i32;
                for e in base + 4 * l..base + 4 * l + 4 {
                    p += v[e].into() * i32::from(qy[e]);
                }
                *lane = lane.wrapping_add(sc(8 * h + 2 * k + l / 4) * p);
            }
        }
    }
    lanes
}

/// The product `_mm256_sign_epi8` + `_mm256_dpbusd_epi32` (or `maddubs`) compute for a signed weight `x`
/// and a signed activation `y` in `mul_sum_i8_pairs_float`: `|x| * sign(y, x)`, where `sign` negates `y`
/// in 8 bits. It equals `x * y` unless `y == -128` and `x < 0`; an activation quant of -128 only comes out
/// of `quantize_row_q8_0` for a NaN input, and the kernels use this exact form only then.
#[inline]
pub(crate) fn sign_trick_mul(x: i32, y: i8) -> i32 {
    let sy = if x < 0 {
        y.wrapping_neg()
    } else if x == 0 {
        0
    } else {
        y
    };
    x.abs() * i32::from(sy)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lane of the reduction tests: cancellations, mixed magnitudes, signed zeros, subnormals, and in
    /// one trial in seven now and then an infinity or a NaN.
    fn lane_value(rng: &mut crate::quant::test_rng::Rng, trial: usize) -> f32 {
        let u = rng.uniform();
        let r = rng.next();
        match r % 16 {
            0 => u * 1e30,
            1 => u * 1e-40,
            2 => -0.0,
            3 if trial.is_multiple_of(7) => f32::from_bits(0x7f80_0000 | (r as u32 & 0x8040_0000)),
            _ => u * ((r >> 8) % 64) as f32,
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn register_reductions_add_as_reduce_add_16() {
        use std::arch::x86_64::*;
        if !crate::numerics::cpu_has("avx") {
            eprintln!("skipping: this CPU has no AVX");
            return;
        }
        let avx512 = crate::numerics::cpu_has("avx512f");
        let mut rng = crate::quant::test_rng::Rng(0x9e37_79b9_7f4a_7c15);
        for trial in 0..20_000 {
            let v: [f32; 16] = std::array::from_fn(|_| lane_value(&mut rng, trial));
            let want = reduce_add_16(&v);
            // SAFETY: AVX checked above, AVX-512 F where used
            let halves = unsafe {
                reduce_add_16_halves(
                    _mm256_loadu_ps(v.as_ptr()),
                    _mm256_loadu_ps(v.as_ptr().add(8)),
                )
            };
            let same = |a: f32| crate::quant::test_rng::same(a, want);
            assert!(same(halves), "{v:?}: {halves:e} vs {want:e}");
            if avx512 {
                let z = unsafe { reduce_add_16_512(_mm512_loadu_ps(v.as_ptr())) };
                assert!(same(z), "{v:?}: {z:e} vs {want:e}");
            }
        }
    }

    /// [`reduce_add_16x16`] gives each of its sixteen inputs' [`reduce_add_16`] bits, in order, on the
    /// same mix of values (each input a different draw, so a wrong lane-to-output map shows).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn sixteen_reductions_at_once_add_as_reduce_add_16() {
        use std::arch::x86_64::*;
        if !crate::numerics::cpu_has("avx512f") {
            eprintln!("skipping: this CPU has no AVX-512 F");
            return;
        }
        let mut rng = crate::quant::test_rng::Rng(0x2545_f491_4f6c_dd1d);
        for trial in 0..2_000 {
            let vs: [[f32; 16]; 16] =
                std::array::from_fn(|_| std::array::from_fn(|_| lane_value(&mut rng, trial)));
            // SAFETY: AVX-512 F checked above
            let got = unsafe {
                reduce_add_16x16(&std::array::from_fn(|j| _mm512_loadu_ps(vs[j].as_ptr())))
            };
            for (j, v) in vs.iter().enumerate() {
                let want = reduce_add_16(v);
                assert!(
                    crate::quant::test_rng::same(got[j], want),
                    "input {j} {v:?}: {:e} vs {want:e}",
                    got[j]
                );
            }
        }
    }

    #[test]
    fn absmax_agrees_with_plain_max_without_nan() {
        let x: Vec<f32> = (0..32)
            .map(|i| ((i * 37 % 29) as f32 - 14.5) * 0.3)
            .collect();
        let plain = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(block_absmax_avx(&x), plain);
    }

    #[test]
    fn absmax_nan_depends_on_lane() {
        // a NaN survives only where it is always the second operand of `maxps`: element 27 (last vector,
        // lane 3, which is the second operand in every later step); anywhere else it is dropped
        for pos in 0..32 {
            let mut x = [1.0f32; 32];
            x[pos] = f32::NAN;
            let m = block_absmax_avx(&x);
            if pos == 27 {
                assert!(m.is_nan());
            } else {
                assert_eq!(m, 1.0, "NaN at {pos}");
            }
        }
    }

    #[test]
    fn rounding_and_packing() {
        assert_eq!(round_even_cvt_i32(2.5), 2);
        assert_eq!(round_even_cvt_i32(3.5), 4);
        assert_eq!(round_even_cvt_i32(-2.5), -2);
        assert_eq!(round_even_cvt_i32(f32::NAN), i32::MIN);
        assert_eq!(round_even_cvt_i32(f32::INFINITY), i32::MIN);
        assert_eq!(saturate_i8(i32::MIN), -128);
        assert_eq!(saturate_i8(300), 127);
        // the add-and-subtract rounding equals round-half-even on every f32 below 2^22 and around it
        let plain = |v: f32| {
            let r = v.round_ties_even();
            if r.is_nan() || !(-2147483648.0..2147483648.0).contains(&r) {
                i32::MIN
            } else {
                r as i32
            }
        };
        let mut bits = 0u32;
        while bits < u32::MAX - 9973 {
            let v = f32::from_bits(bits);
            assert_eq!(round_even_cvt_i32(v), plain(v), "{v:e}");
            bits += 9973;
        }
        for i in -300_000..300_000 {
            let v = i as f32 * 0.5;
            assert_eq!(round_even_cvt_i32(v), plain(v), "{v}");
            for v in [4_194_304.0 + v, -4_194_304.0 + v] {
                assert_eq!(round_even_cvt_i32(v), plain(v), "{v}");
            }
        }
    }

    #[test]
    fn sign_trick() {
        for x in -128..=127 {
            for y in -127i8..=127 {
                assert_eq!(sign_trick_mul(x, y), x * i32::from(y));
            }
            let want = if x < 0 { x.abs() * -128 } else { x * -128 };
            assert_eq!(sign_trick_mul(x, -128), want);
        }
    }

    #[test]
    fn fma_is_correctly_rounded() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let check = |a: f32, b: f32, c: f32| {
            let (got, want) = (fma(a, b, c), a.mul_add(b, c));
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "fma({a:e}, {b:e}, {c:e})"
            );
        };
        for _ in 0..2_000_000 {
            let r = next();
            // random bit patterns (all exponents, NaN, inf, subnormals) ...
            check(
                f32::from_bits(r as u32),
                f32::from_bits((r >> 32) as u32),
                f32::from_bits(next() as u32),
            );
            // ... and the kernels' operands: f16*f16 scales, integer lane sums, running sums with
            // cancellation, where r lands near f32 halfway points
            let d = f32::from(half::f16::from_bits(r as u16 & 0x7bff))
                * f32::from(half::f16::from_bits((r >> 16) as u16 & 0x7bff));
            let lane = ((r >> 32) as i32 >> 8) as f32;
            let c = -(d * lane)
                + f32::from_bits((next() as u32 & 0x3fff_ffff) | 0x0080_0000)
                    * if r >> 63 == 0 { 1.0 } else { -1.0 };
            check(d, lane, c);
            check(d, lane, (d * lane) * 0.5);
        }
        // exact halfway cases: 1 + 2^-24 is halfway between 1 and 1 + 2^-23
        check(
            1.0 + f32::EPSILON,
            1.0 + f32::EPSILON,
            -1.0 - 2.0 * f32::EPSILON,
        );
        check(1.0, 1.0, f32::EPSILON / 2.0);
        check(1.0, 1.0 + f32::EPSILON, f32::EPSILON / 2.0);
        check(f32::MIN_POSITIVE, 0.5, 0.0);
        check(f32::MAX, 2.0, -f32::MAX);
    }

    #[test]
    fn reductions() {
        let a: [f32; 8] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        assert_eq!(hsum_float_8(&a), 36.0);
        let b: [f32; 16] = core::array::from_fn(|i| i as f32);
        assert_eq!(reduce_add_16(&b), 120.0);
        // grouping is visible with cancellation
        let c: [f32; 8] = [1e8, 1.0, -1e8, 1.0, 1.0, 0.0, 0.0, 0.0];
        assert_eq!(
            hsum_float_8(&c),
            ((1e8f32 + 1.0) + (-1e8 + 0.0)) + ((1.0 + 0.0) + (1.0 + 0.0))
        );
    }
}
