//! ggml tensor types: block layouts, row dequantization, and dot products in two numerics modes.
//!
//! Source of truth for every layout: ggml's `ggml/src/ggml-common.h` (block structs) and
//! `ggml/src/ggml-quants.c` / `ggml/src/ggml-cpu/quants.c` (dequantize / quantize / vec_dot reference
//! code). Weights are read as little-endian bytes straight from the memory map; nothing is dequantized at
//! load.

mod types;

pub use types::GgmlType;

/// How a matrix-vector product is computed.
///
/// - [`NumericsMode::Reference`]: dequantize each weight block to f32 and multiply-accumulate in f32
///   against the f32 activation. Tracks an f32 framework (transformers) on the dequantized weights.
/// - [`NumericsMode::Ggml`]: do what ggml's CPU backend does: quantize the activation row to the weight
///   type's `vec_dot_type` (ggml-cpu.c `type_traits_cpu`), then integer dot products per block with ggml's
///   scale order. Tracks llama.cpp.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
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
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "reference" => Ok(NumericsMode::Reference),
            "ggml" => Ok(NumericsMode::Ggml),
            other => Err(format!("unknown numerics mode {other:?} (expected `reference` or `ggml`)")),
        }
    }
}

impl std::fmt::Display for NumericsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
