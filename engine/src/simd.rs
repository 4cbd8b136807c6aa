//! The SIMD axis: which instruction set the compute kernels use, chosen at run time.
//!
//! [`Simd::Off`] is the portable scalar code, the reference every SIMD kernel is tested against;
//! [`Simd::Avx2`] runs the AVX2 + FMA kernels of `quant::avx2` where one exists for the weight type and
//! numerics mode, and the scalar kernel elsewhere. In ggml mode both give the same bits (they mirror the same
//! llama.cpp kernels). ggml-cpu has only AVX2 branches for its quantized dot products (AVX-512 machines
//! run them too, with VNNI for the exact integer part), so `avx2` is also the right kernel set on an
//! AVX-512 CPU; there is no separate `avx512` setting yet.

use crate::{Error, Result};

/// The kernel instruction set of a session (`--simd`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Simd {
    /// Portable scalar kernels.
    #[default]
    Off,
    /// x86-64 AVX2 + FMA (+ F16C) kernels.
    Avx2,
}

impl Simd {
    /// Every setting, in order of preference for [`Simd::detect`] (best last).
    pub const ALL: [Simd; 2] = [Simd::Off, Simd::Avx2];

    /// The name used on the command line and in reports: `off`, `avx2`.
    pub fn name(self) -> &'static str {
        match self {
            Simd::Off => "off",
            Simd::Avx2 => "avx2",
        }
    }

    /// True if this CPU can run the setting (detected at run time with `is_x86_feature_detected!`).
    pub fn available(self) -> bool {
        match self {
            Simd::Off => true,
            Simd::Avx2 => crate::quant::avx2_available(),
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

    /// Parse `off`, `avx2` or `auto` (= [`Simd::detect`]).
    ///
    /// Errors: [`Error::Invalid`] for another word, or for a setting this CPU cannot run (naming it).
    pub fn parse(s: &str) -> Result<Simd> {
        let simd = match s {
            "auto" => return Ok(Simd::detect()),
            "off" | "scalar" => Simd::Off,
            "avx2" => Simd::Avx2,
            other => {
                return Err(Error::Invalid(format!(
                    "unknown SIMD setting {other:?} (expected `off`, `avx2` or `auto`)"
                )))
            }
        };
        if !simd.available() {
            return Err(Error::Invalid(format!(
                "SIMD setting `{}` needs CPU features this machine lacks (avx2, fma, f16c)",
                simd.name()
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
        match Simd::parse("avx2") {
            Ok(s) => assert!(s.available()),
            Err(e) => {
                assert!(!Simd::Avx2.available());
                assert!(e.to_string().contains("lacks"), "{e}");
            }
        }
        for s in Simd::ALL {
            assert_eq!(s.to_string(), s.name());
        }
    }
}
