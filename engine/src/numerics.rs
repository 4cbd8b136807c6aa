//! The numerics of a session, in one leaf module: how a matrix product is computed ([`NumericsMode`]),
//! which ggml-cpu build ggml mode mirrors ([`GgmlTarget`]), which instruction set the kernels use
//! ([`Simd`]), the CPU detection behind them, and [`Numerics`], the three carried together through the
//! engine. This module imports nothing from the crate but [`crate::error`], so every other module may
//! depend on it without a cycle.
//!
//! The SIMD axis: [`Simd::Off`] is the portable scalar code, the reference every SIMD kernel is tested
//! against; [`Simd::Avx2`] runs the AVX2 + FMA kernels of `quant::avx2` where one exists for the weight
//! type and numerics mode, and the scalar kernel elsewhere; [`Simd::Avx512`] runs the same kernels, except
//! that the 32-element block products of Q4_1, Q5_0 and Q8_0 weights are `vpdpbusd` (AVX-512 VNNI) tiles
//! (`quant::avx512`). In ggml mode all three give the same bits: they mirror the same llama.cpp kernels,
//! whose block products are exact integers whichever instruction computes them (ggml-cpu's own x86
//! kernels switch to `_mm256_dpbusd_epi32` when built with `__AVX512VNNI__`), and every rounding step
//! (the per-block fma, the reduction trees) is the same instruction sequence. Which reduction trees ggml
//! mode mirrors (8 or 16 lanes) is the golden's CPU target ([`GgmlTarget`]), not this setting.

use crate::error::{Error, Result};

/// The environment variable that caps the CPU features lockstep sees: `avx2` runs every host-kind
/// decision (SIMD settings available, `auto`, the ggml target of `GGML_NATIVE`, which kernels a test
/// iterates, the bench's FMA probe) as on an AVX2-only CPU, whatever AVX-512 this one has; `scalar` as on a
/// CPU without AVX2 either; `native` (or unset) as detected. It lets an AVX-512 machine run the suite as an
/// AVX2-only one would (issue 41: coverage that depends on the host hides there).
pub const CPU_CAP_ENV: &str = "LOCKSTEP_CPU";

/// How far [`cpu_has`] lets the detected features through ([`CPU_CAP_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuCap {
    /// No x86 SIMD feature at all: the portable scalar paths only.
    Scalar,
    /// Up to AVX2 (AVX, AVX2, FMA, F16C, BMI2, SSE*): every AVX-512 and AMX feature reads as absent.
    Avx2,
    /// Every feature the CPU has.
    Native,
}

impl CpuCap {
    /// The cap this process runs under: [`CPU_CAP_ENV`] read once.
    ///
    /// Errors: none; an unknown value is reported on stderr once and treated as `native` (the variable is
    /// a test aid: a typo must not silently narrow a run, and the report records the cap in force).
    pub fn current() -> CpuCap {
        static CAP: std::sync::OnceLock<CpuCap> = std::sync::OnceLock::new();
        *CAP.get_or_init(|| match std::env::var(CPU_CAP_ENV).ok().as_deref() {
            None | Some("") | Some("native") => CpuCap::Native,
            Some("avx2") => CpuCap::Avx2,
            Some("scalar") | Some("off") => CpuCap::Scalar,
            Some(other) => {
                eprintln!(
                    "warning: {CPU_CAP_ENV}={other:?} is not native, avx2 or scalar; using native"
                );
                CpuCap::Native
            }
        })
    }

    /// `native`, `avx2` or `scalar`.
    pub fn name(self) -> &'static str {
        match self {
            CpuCap::Scalar => "scalar",
            CpuCap::Avx2 => "avx2",
            CpuCap::Native => "native",
        }
    }

    /// True if a feature of this name (as `is_x86_feature_detected!` or `/proc/cpuinfo` spells it) is
    /// let through by the cap: everything under `native`, nothing under `scalar`, and under `avx2` every
    /// feature but the AVX-512 and AMX families.
    pub fn allows(self, feature: &str) -> bool {
        match self {
            CpuCap::Native => true,
            CpuCap::Scalar => false,
            CpuCap::Avx2 => !(feature.starts_with("avx512") || feature.starts_with("amx")),
        }
    }
}

/// True if this CPU has the x86 feature `feature` (the names of `is_x86_feature_detected!`: `avx`,
/// `avx2`, `fma`, `f16c`, `avx512f`, `avx512dq`, `avx512bw`, `avx512vl`, `avx512vnni`, `avx512bf16`) and
/// the cap in force ([`CpuCap::current`]) lets it through. Every host-kind decision of lockstep reads
/// the CPU through here. Always false off x86-64 and for a name not listed.
pub fn cpu_has(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let detected = match feature {
            "avx" => is_x86_feature_detected!("avx"),
            "avx2" => is_x86_feature_detected!("avx2"),
            "fma" => is_x86_feature_detected!("fma"),
            "f16c" => is_x86_feature_detected!("f16c"),
            "avx512f" => is_x86_feature_detected!("avx512f"),
            "avx512dq" => is_x86_feature_detected!("avx512dq"),
            "avx512bw" => is_x86_feature_detected!("avx512bw"),
            "avx512vl" => is_x86_feature_detected!("avx512vl"),
            "avx512vnni" => is_x86_feature_detected!("avx512vnni"),
            "avx512bf16" => is_x86_feature_detected!("avx512bf16"),
            _ => false,
        };
        detected && CpuCap::current().allows(feature)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = feature;
        false
    }
}

/// True if this CPU runs the AVX2 + FMA kernels ([`Simd::Avx2`]): AVX2, FMA and F16C, detected at run
/// time ([`cpu_has`], under the cap of [`CPU_CAP_ENV`]). Always false off x86-64.
pub fn avx2_available() -> bool {
    cpu_has("avx2") && cpu_has("fma") && cpu_has("f16c")
}

/// True if this CPU runs the AVX-512 VNNI tiles ([`Simd::Avx512`]): the AVX2 kernels' features
/// ([`avx2_available`]) and AVX-512 F, BW, VL and VNNI, detected at run time ([`cpu_has`]). Always
/// false off x86-64.
pub fn avx512_available() -> bool {
    avx2_available()
        && cpu_has("avx512f")
        && cpu_has("avx512bw")
        && cpu_has("avx512vl")
        && cpu_has("avx512vnni")
}

/// How a matrix-vector product is computed.
///
/// - [`NumericsMode::Reference`]: dequantize each weight block to f32 and multiply-accumulate in f32
///   against the f32 activation. Tracks an f32 framework (transformers) on the dequantized weights.
/// - [`NumericsMode::Ggml`]: do what ggml's CPU backend does: quantize the activation row to the weight
///   type's `vec_dot_type` (ggml-cpu.c `type_traits_cpu`), then integer dot products per block with ggml's
///   scale order. Tracks llama.cpp.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NumericsMode {
    /// Dequantize to f32, f32 accumulation.
    #[default]
    Reference,
    /// Quantized activations and integer block dot products, as ggml-cpu.
    Ggml,
}

impl NumericsMode {
    /// The lower-case name used on the command line and in reports: `reference` or `ggml`.
    pub fn name(self) -> &'static str {
        match self {
            NumericsMode::Reference => "reference",
            NumericsMode::Ggml => "ggml",
        }
    }
}

impl std::str::FromStr for NumericsMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "reference" => Ok(NumericsMode::Reference),
            "ggml" => Ok(NumericsMode::Ggml),
            other => Err(format!(
                "unknown numerics mode {other:?} (expected `reference` or `ggml`)"
            )),
        }
    }
}

impl std::fmt::Display for NumericsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The ggml-cpu build ggml mode reproduces: the SIMD branches llama.cpp compiled for its host's CPU
/// (`GGML_NATIVE`). Selected from the CPU flags a golden records ([`GgmlTarget::from_cpu_flags`]).
///
/// The two AVX-512 targets differ only in the kernels of BF16 weights: `ggml_vec_dot_bf16` (vec.cpp) and
/// llamafile's tinyBLAS for BF16 (llamafile/sgemm.cpp) have an `__AVX512BF16__` branch (`vdpbf16ps`)
/// and an `__AVX512F__` one (bf16 widened to f32, f32 fmas); everything else the two builds run is the
/// same code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlTarget {
    /// `__AVX2__ && __FMA__` without AVX-512 F/DQ: 8-lane `__m256` branches.
    Avx2,
    /// `__AVX512F__ && __AVX512DQ__` without `__AVX512BF16__`: 16-lane `__m512` branches, BF16 weights
    /// widened to f32 (an Intel Xeon without AVX512_BF16, the host of the first synth goldens).
    Avx512NoBf16,
    /// `__AVX512F__ && __AVX512DQ__` and `__AVX512BF16__`: 16-lane `__m512` branches, BF16 weights through
    /// `_mm512_dpbf16_ps` (the AMD EPYC host of the first SmolLM2 goldens).
    #[default]
    Avx512,
}

impl GgmlTarget {
    /// Every target, narrowest first.
    pub const ALL: [GgmlTarget; 3] = [
        GgmlTarget::Avx2,
        GgmlTarget::Avx512NoBf16,
        GgmlTarget::Avx512,
    ];

    /// `avx2`, `avx512-nobf16` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            GgmlTarget::Avx2 => "avx2",
            GgmlTarget::Avx512NoBf16 => "avx512-nobf16",
            GgmlTarget::Avx512 => "avx512",
        }
    }

    /// The target ggml-cpu compiles for a CPU with these `/proc/cpuinfo`-style flags (`avx512f`,
    /// `avx512dq`, `avx512_bf16`, `avx2`, `fma`, ...), as `GGML_NATIVE` does. `None` when the CPU has
    /// neither (ggml would run kernels lockstep does not mirror).
    pub fn from_cpu_flags<S: AsRef<str>>(flags: &[S]) -> Option<GgmlTarget> {
        let has = |f: &str| flags.iter().any(|x| x.as_ref() == f);
        if has("avx512f") && has("avx512dq") {
            if has("avx512_bf16") {
                Some(GgmlTarget::Avx512)
            } else {
                Some(GgmlTarget::Avx512NoBf16)
            }
        } else if has("avx2") && has("fma") {
            Some(GgmlTarget::Avx2)
        } else {
            None
        }
    }

    /// The target llama.cpp built with `GGML_NATIVE` would use on the machine running this code
    /// ([`cpu_has`]); [`GgmlTarget::Avx512`] off x86 or on x86 without AVX2+FMA, where
    /// no target describes llama.cpp and the choice only keeps ggml mode deterministic.
    pub fn host() -> GgmlTarget {
        if cpu_has("avx512f") && cpu_has("avx512dq") {
            return if cpu_has("avx512bf16") {
                GgmlTarget::Avx512
            } else {
                GgmlTarget::Avx512NoBf16
            };
        }
        if cpu_has("avx2") && cpu_has("fma") {
            return GgmlTarget::Avx2;
        }
        GgmlTarget::Avx512
    }

    /// True for the AVX-512 builds ([`GgmlTarget::Avx512`], [`GgmlTarget::Avx512NoBf16`]): `__AVX512F__`,
    /// 16-lane f32 vectors.
    pub fn is_avx512(self) -> bool {
        match self {
            GgmlTarget::Avx2 => false,
            GgmlTarget::Avx512NoBf16 | GgmlTarget::Avx512 => true,
        }
    }

    /// f32 lanes of this target's vectors.
    pub fn lanes(self) -> usize {
        match self {
            GgmlTarget::Avx2 => 8,
            GgmlTarget::Avx512NoBf16 | GgmlTarget::Avx512 => 16,
        }
    }
}

impl std::str::FromStr for GgmlTarget {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        GgmlTarget::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = GgmlTarget::ALL.iter().map(|t| t.name()).collect();
                format!(
                    "unknown ggml target {s:?} (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

impl std::fmt::Display for GgmlTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

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
            Simd::Avx2 => avx2_available(),
            Simd::Avx512 => avx512_available(),
        }
    }

    /// True if the setting runs the AVX2 + FMA kernels (`avx2`, and `avx512`, which adds VNNI tiles to
    /// them) and this CPU has them.
    pub fn avx2_kernels(self) -> bool {
        self != Simd::Off && self.available()
    }

    /// The setting whose results `mode` under `self` gives: reference mode's SIMD kernels all compute one
    /// 16-lane fma order (`quant/reference_fma.rs`: AVX-512 tiles and AVX2 tiles, the same bits), so its
    /// `avx512` gives exactly what `avx2` gives and is named `avx2`; ggml mode runs each setting's own. A
    /// run matrix gives each (mode, results) one cell.
    pub fn for_mode(self, mode: NumericsMode) -> Simd {
        match (mode, self) {
            (NumericsMode::Reference, Simd::Avx512) => Simd::Avx2,
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

/// The numerics of a session, carried as one value through the engine (matmuls, attention, gates, RoPE):
/// the [`NumericsMode`], the ggml-cpu build ggml mode mirrors ([`GgmlTarget`]; ignored in reference mode)
/// and the kernels' instruction set ([`Simd`]; in ggml mode it changes no bit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Numerics {
    /// How matrix products (and the ops that differ between the modes) are computed.
    pub mode: NumericsMode,
    /// The ggml-cpu build ggml mode mirrors (default [`GgmlTarget::Avx512`]).
    pub target: GgmlTarget,
    /// The SIMD setting of the compute kernels (default [`Simd::Off`]).
    pub simd: Simd,
}

impl Numerics {
    /// `mode` with the default target ([`GgmlTarget::Avx512`]) and the scalar kernels ([`Simd::Off`]).
    pub fn new(mode: NumericsMode) -> Numerics {
        Numerics {
            mode,
            ..Numerics::default()
        }
    }

    /// Reference mode, scalar kernels.
    pub fn reference() -> Numerics {
        Numerics::new(NumericsMode::Reference)
    }

    /// Ggml mode mirroring `target`, scalar kernels.
    pub fn ggml(target: GgmlTarget) -> Numerics {
        Numerics {
            mode: NumericsMode::Ggml,
            target,
            simd: Simd::Off,
        }
    }

    /// The same numerics with the ggml target `target`.
    pub fn with_target(self, target: GgmlTarget) -> Numerics {
        Numerics { target, ..self }
    }

    /// The same numerics with the kernels of `simd`.
    pub fn with_simd(self, simd: Simd) -> Numerics {
        Numerics { simd, ..self }
    }

    /// True in ggml mode.
    pub fn is_ggml(self) -> bool {
        self.mode == NumericsMode::Ggml
    }
}

impl From<NumericsMode> for Numerics {
    /// [`Numerics::new`]: `mode` with the default target and the scalar kernels.
    fn from(mode: NumericsMode) -> Numerics {
        Numerics::new(mode)
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

    #[test]
    fn ggml_target_from_flags_tells_the_avx512_builds_apart_by_avx512_bf16() {
        let flags = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
        let avx2 = "sse4_2 avx avx2 fma f16c";
        let xeon = format!("{avx2} avx512f avx512dq avx512bw avx512vl avx512_vnni");
        let epyc = format!("{xeon} avx512_bf16");
        assert_eq!(
            GgmlTarget::from_cpu_flags(&flags(avx2)),
            Some(GgmlTarget::Avx2)
        );
        assert_eq!(
            GgmlTarget::from_cpu_flags(&flags(&xeon)),
            Some(GgmlTarget::Avx512NoBf16)
        );
        assert_eq!(
            GgmlTarget::from_cpu_flags(&flags(&epyc)),
            Some(GgmlTarget::Avx512)
        );
        // AVX512_BF16 without AVX-512 F/DQ does not make an AVX-512 build
        assert_eq!(
            GgmlTarget::from_cpu_flags(&flags(&format!("{avx2} avx512_bf16"))),
            Some(GgmlTarget::Avx2)
        );
        assert_eq!(GgmlTarget::from_cpu_flags(&flags("sse4_2 avx")), None);
        for t in GgmlTarget::ALL {
            assert_eq!(t.name().parse::<GgmlTarget>(), Ok(t));
            assert_eq!(t.lanes(), if t.is_avx512() { 16 } else { 8 });
        }
        let e = "avx512bf16".parse::<GgmlTarget>().unwrap_err();
        assert!(e.contains("avx512-nobf16"), "{e}");
        if cpu_has("avx512f") && cpu_has("avx512dq") {
            let want = if cpu_has("avx512bf16") {
                GgmlTarget::Avx512
            } else {
                GgmlTarget::Avx512NoBf16
            };
            assert_eq!(GgmlTarget::host(), want);
        }
    }
}
