//! Half-precision conversions exactly as ggml performs them, and little-endian field readers.
//!
//! ggml has two f32 → f16 conversions that differ only on NaN:
//! - `GGML_CPU_FP32_TO_FP16` (ggml-cpu/simd-mappings.h) on x86 with F16C is `_cvtss_sh(x, 0)`: round to
//!   nearest even; a NaN keeps its sign and top 10 payload bits and gets the quiet bit. ggml-cpu uses it for
//!   activations (`quantize_row_q8_0` / `q8_1`, `ggml_cpu_fp32_to_fp16`). [`f32_to_f16_cpu`] computes it
//!   in portable code (`half::f16::from_f32_const`, the `half` crate's software conversion, never F16C:
//!   `half::f16::from_f32` would take F16C at run time whatever the session's `--simd` says), with the
//!   same rounding and NaN rule as the instruction — checked against F16C in the tests below.
//! - `GGML_FP32_TO_FP16` in libggml-base (ggml-impl.h `ggml_compute_fp32_to_fp16`, a branch-free bit trick):
//!   the same round to nearest even, but every NaN becomes `sign | 0x7E00`. The `_ref` quantizers that write
//!   model files use it.
//!
//! f32 → bf16 (`ggml_compute_fp32_to_bf16`, ggml-impl.h): round to nearest even on the bit pattern; a NaN
//! keeps its top 16 bits with bit 6 (the quiet bit) set. `half::bf16::from_f32` is the same function.
//! f16/bf16 → f32 is exact everywhere.

use half::{bf16, f16};

/// f16 bits → f32 (exact; `GGML_CPU_FP16_TO_FP32` / `GGML_FP16_TO_FP32`), without branches on the common
/// path: the exponent and mantissa shifted into an f32's low bits are the value times 2^-112 (a normal or
/// subnormal f32, exactly), so one multiply by 2^112 rebiases every finite f16, subnormals included.
/// Infinities and NaNs as `half`'s software conversion gives them (a NaN keeps its payload and gets the
/// quiet bit): the same bits as `half::f16::to_f32_const` for all 65 536 inputs (tested). Inlines into the
/// kernels, where the run-time F16C dispatch of `half`'s `to_f32` would be a call per block.
#[inline(always)]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let em = u32::from(bits & 0x7FFF);
    if em >= 0x7C00 {
        let man = em & 0x03FF;
        let quiet = if man == 0 { 0 } else { 0x0040_0000 };
        return f32::from_bits(sign | 0x7F80_0000 | quiet | (man << 13));
    }
    let magnitude = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000); // × 2^112
    f32::from_bits(sign | magnitude.to_bits())
}

/// bf16 bits → f32 (exact; `ggml_compute_bf16_to_fp32`).
#[inline]
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 → f16 bits as ggml-cpu on x86 (`GGML_CPU_FP32_TO_FP16` = F16C `_cvtss_sh(x, 0)`), in portable code
/// (`half`'s software conversion, no F16C: the scalar kernels [`crate::Simd::Off`] runs use it; the same
/// bits as the instruction, tested).
#[inline]
pub(crate) fn f32_to_f16_cpu(x: f32) -> u16 {
    f16::from_f32_const(x).to_bits()
}

/// f32 → f16 bits as libggml-base (`GGML_FP32_TO_FP16` = `ggml_compute_fp32_to_fp16`): like
/// [`f32_to_f16_cpu`] except that every NaN becomes the canonical `sign | 0x7E00`.
#[inline]
pub(crate) fn f32_to_f16_ref(x: f32) -> u16 {
    if x.is_nan() {
        ((x.to_bits() >> 16) & 0x8000) as u16 | 0x7E00
    } else {
        f32_to_f16_cpu(x)
    }
}

/// f32 → bf16 bits (`ggml_compute_fp32_to_bf16`: round to nearest even, NaN forced quiet).
#[inline]
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

/// The little-endian u16 at `off`.
#[inline]
pub(crate) fn read_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// The little-endian f16 at `off`, widened to f32.
#[inline]
pub(crate) fn read_f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(read_u16(b, off))
}

/// The little-endian f32 at `off`.
#[inline]
pub(crate) fn read_f32(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// C's `(int8_t)f` as gcc compiles it for x86-64: `cvttss2si` (truncate toward zero; NaN and out-of-range
/// give `INT32_MIN`), then keep the low byte. The `_ref` quantizers convert this way.
#[inline]
pub(crate) fn c_f32_to_i8(v: f32) -> i8 {
    c_f32_to_i32(v) as i8
}

/// C's `(int)f` as `cvttss2si` computes it: truncation, `INT32_MIN` for NaN and out-of-range values.
#[inline]
pub(crate) fn c_f32_to_i32(v: f32) -> i32 {
    if v.is_nan() || !(-2147483648.0..2147483648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_to_f32_is_halfs_conversion_on_every_input() {
        for bits in 0..=u16::MAX {
            assert_eq!(
                f16_to_f32(bits).to_bits(),
                f16::from_bits(bits).to_f32_const().to_bits(),
                "{bits:#06x}"
            );
        }
    }

    /// ggml_compute_fp32_to_bf16, written out independently of `half`.
    fn ggml_bf16(s: f32) -> u16 {
        let u = s.to_bits();
        if (u & 0x7fff_ffff) > 0x7f80_0000 {
            return ((u >> 16) | 64) as u16;
        }
        (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
    }

    /// ggml_compute_fp32_to_fp16 (libggml-base), written out: the FP16 library's bit trick.
    fn ggml_fp16_ref(f: f32) -> u16 {
        let scale_to_inf = f32::from_bits(0x7780_0000); // 0x1.0p+112f
        let scale_to_zero = f32::from_bits(0x0880_0000); // 0x1.0p-110f
        let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
        let w = f.to_bits();
        let shl1_w = w.wrapping_add(w);
        let sign = w & 0x8000_0000;
        let mut bias = shl1_w & 0xFF00_0000;
        if bias < 0x7100_0000 {
            bias = 0x7100_0000;
        }
        base += f32::from_bits((bias >> 1) + 0x0780_0000);
        let bits = base.to_bits();
        let exp_bits = (bits >> 13) & 0x0000_7C00;
        let mantissa_bits = bits & 0x0000_0FFF;
        let nonsign = exp_bits + mantissa_bits;
        ((sign >> 16)
            | if shl1_w > 0xFF00_0000 {
                0x7E00
            } else {
                nonsign
            }) as u16
    }

    /// Bit patterns to sweep: a stride over all of u32 plus every f16 rounding boundary neighbourhood.
    fn patterns() -> impl Iterator<Item = u32> {
        let stride = (0..u32::MAX / 7919).map(|i| i * 7919);
        let edges = (0u16..=0xFFFF).flat_map(|h| {
            // f32 values near each f16 value's upper rounding midpoint, both signs
            let f = f32::from(f16::from_bits(h));
            let b = f.to_bits();
            let mid = b.wrapping_add(0x1000);
            [b, mid.wrapping_sub(1), mid, mid.wrapping_add(1)]
        });
        let special = [
            0u32,
            0x8000_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0xffc0_0000,
            0x7f80_0001,
            0x7fbf_ffff,
            0x7f7f_ffff,
            0x477f_f000,
            0x477f_efff,
            0x0000_0001,
            0x3380_0000,
            0x3300_0000,
            0x3300_0001,
        ];
        stride.chain(edges).chain(special)
    }

    #[test]
    fn bf16_matches_ggml() {
        for b in patterns() {
            let f = f32::from_bits(b);
            assert_eq!(f32_to_bf16(f), ggml_bf16(f), "bits {b:#010x}");
        }
    }

    #[test]
    fn f16_ref_matches_ggml_bit_trick() {
        for b in patterns() {
            let f = f32::from_bits(b);
            assert_eq!(f32_to_f16_ref(f), ggml_fp16_ref(f), "bits {b:#010x}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16_cpu_matches_f16c_hardware() {
        if !crate::numerics::cpu_has("f16c") {
            eprintln!("no F16C on this CPU; skipped");
            return;
        }
        #[target_feature(enable = "f16c")]
        fn hw(x: f32) -> u16 {
            use std::arch::x86_64::*;
            let v = _mm_cvtps_ph::<0>(_mm_set_ss(x));
            _mm_extract_epi16::<0>(v) as u16
        }
        for b in patterns() {
            let f = f32::from_bits(b);
            // SAFETY: F16C was detected above.
            let want = unsafe { hw(f) };
            assert_eq!(f32_to_f16_cpu(f), want, "bits {b:#010x}");
        }
    }

    #[test]
    fn widening_is_exact() {
        for h in 0u16..=0xFFFF {
            let f = f16_to_f32(h);
            // the software path gives the same bits as half's run-time F16C path, NaNs included
            assert_eq!(
                f.to_bits(),
                f16::from_bits(h).to_f32().to_bits(),
                "{h:#06x}"
            );
            if f.is_nan() {
                assert!(f16::from_bits(h).is_nan());
            } else {
                assert_eq!(f32_to_f16_cpu(f), h);
            }
            let g = bf16_to_f32(h);
            if !g.is_nan() {
                assert_eq!(f32_to_bf16(g), h);
            }
        }
    }

    #[test]
    fn c_conversions() {
        assert_eq!(c_f32_to_i8(f32::NAN), 0);
        assert_eq!(c_f32_to_i8(f32::INFINITY), 0);
        assert_eq!(c_f32_to_i8(200.7), -56);
        assert_eq!(c_f32_to_i8(-3.9), -3);
        assert_eq!(c_f32_to_i32(3e9), i32::MIN);
        assert_eq!(c_f32_to_i32(-2147483648.0), i32::MIN);
    }
}
