//! The SIMD axis: which instruction set the compute kernels use, chosen at run time.
//!
//! [`Simd::Off`] is the portable scalar code, the reference every SIMD kernel is tested against;
//! [`Simd::Avx2`] runs the AVX2 + FMA kernels of `quant::avx2` where one exists for the weight type and
//! numerics mode, and the scalar kernel elsewhere; [`Simd::Avx512`] runs the same kernels, except that the
//! 32-element block products of Q4_1, Q5_0 and Q8_0 weights are `vpdpbusd` (AVX-512 VNNI) tiles
//! (`quant::avx512`). In ggml mode all three give the same bits: they mirror the same llama.cpp kernels,
//! whose block products are exact integers whichever instruction computes them (ggml-cpu's own x86
//! kernels switch to `_mm256_dpbusd_epi32` when built with `__AVX512VNNI__`), and every rounding step
//! (the per-block fma, the reduction trees) is the same instruction sequence. Which reduction trees ggml
//! mode mirrors (8 or 16 lanes) is the golden's CPU target (`GgmlTarget`), not this setting.

use crate::{Error, Result};

/// The kernel instruction set of a session (`--simd`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Simd {
    /// Portable scalar kernels.
    #[default]
    Off,
    /// x86-64 AVX2 + FMA (+ F16C) kernels.
    Avx2,
    /// The AVX2 kernels, with AVX-512 VNNI (`vpdpbusd` on 256-bit vectors: AVX-512 F, BW, VL, VNNI) for
    /// the integer block products of Q4_1, Q5_0 and Q8_0 weights.
    Avx512,
}

impl Simd {
    /// Every setting, in order of preference for [`Simd::detect`] (best last).
    pub const ALL: [Simd; 3] = [Simd::Off, Simd::Avx2, Simd::Avx512];

    /// The name used on the command line and in reports: `off`, `avx2`, `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            Simd::Off => "off",
            Simd::Avx2 => "avx2",
            Simd::Avx512 => "avx512",
        }
    }

    /// The CPU features the setting needs, as `is_x86_feature_detected!` names them.
    pub fn features(self) -> &'static [&'static str] {
        match self {
            Simd::Off => &[],
            Simd::Avx2 => &["avx2", "fma", "f16c"],
            Simd::Avx512 => &[
                "avx2",
                "fma",
                "f16c",
                "avx512f",
                "avx512bw",
                "avx512vl",
                "avx512vnni",
            ],
        }
    }

    /// True if this CPU can run the setting (detected at run time with `is_x86_feature_detected!`).
    pub fn available(self) -> bool {
        match self {
            Simd::Off => true,
            Simd::Avx2 => crate::quant::avx2_available(),
            Simd::Avx512 => crate::quant::avx512_available(),
        }
    }

    /// True if the setting runs the AVX2 + FMA kernels (`avx2`, and `avx512`, which adds VNNI tiles to
    /// them) and this CPU has them.
    pub fn avx2_kernels(self) -> bool {
        self != Simd::Off && self.available()
    }

    /// The setting whose kernels run in `mode` under `self`: reference mode has AVX2 kernels (explicit
    /// vectors for the commonest weight types, the rest compiled with AVX2) but none of AVX-512's, so its
    /// `avx512` runs exactly what `avx2` runs and is named `avx2`; ggml mode runs each setting's own. A run
    /// matrix gives each (mode, kernels) one cell.
    pub fn for_mode(self, mode: crate::NumericsMode) -> Simd {
        match (mode, self) {
            (crate::NumericsMode::Reference, Simd::Avx512) => Simd::Avx2,
            (_, s) => s,
        }
    }

    /// The best setting this CPU runs (`auto`).
    pub fn detect() -> Simd {
        Simd::ALL
            .into_iter()
            .rev()
            .find(|s| s.available())
            .unwrap_or(Simd::Off)
    }

    /// Parse `off`, `avx2`, `avx512` or `auto` (= [`Simd::detect`]).
    ///
    /// Errors: [`Error::Invalid`] for another word, or for a setting this CPU cannot run (naming it).
    pub fn parse(s: &str) -> Result<Simd> {
        let simd = match s {
            "auto" => return Ok(Simd::detect()),
            "off" | "scalar" => Simd::Off,
            "avx2" => Simd::Avx2,
            "avx512" => Simd::Avx512,
            other => {
                return Err(Error::Invalid(format!(
                    "unknown SIMD setting {other:?} (expected `off`, `avx2`, `avx512` or `auto`)"
                )))
            }
        };
        if !simd.available() {
            return Err(Error::Invalid(format!(
                "SIMD setting `{}` needs CPU features this machine lacks ({})",
                simd.name(),
                simd.features().join(", ")
            )));
        }
        Ok(simd)
    }
}

impl std::fmt::Display for Simd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names_and_refuses_others() {
        assert_eq!(Simd::parse("off").unwrap(), Simd::Off);
        assert_eq!(Simd::parse("auto").unwrap(), Simd::detect());
        let e = Simd::parse("neon").unwrap_err().to_string();
        assert!(e.contains("neon") && e.contains("avx2"), "{e}");
        for want in [Simd::Avx2, Simd::Avx512] {
            match Simd::parse(want.name()) {
                Ok(s) => assert!(s == want && s.available()),
                Err(e) => {
                    assert!(!want.available());
                    assert!(e.to_string().contains("lacks"), "{e}");
                }
            }
        }
        assert!(!Simd::Off.avx2_kernels());
        for s in Simd::ALL {
            assert_eq!(s.to_string(), s.name());
        }
    }
}
