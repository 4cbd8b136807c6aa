//! The output file types `lockstep quantize` makes: their names, `llama_ftype` numbers and default tensor
//! types.
//!
//! Mirrors `QUANT_OPTIONS` in tools/quantize/quantize.cpp (the name → `llama_ftype` table; `Q3_K`, `Q4_K`
//! and `Q5_K` are its aliases of the `_M` file types), `enum llama_ftype` in include/llama.h and
//! `llama_ftype_get_default_type` in src/llama-quant.cpp, for the fifteen types lockstep's variants use.

use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// An output file type, as `llama-quantize` names it on its command line.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
}

/// (file type, llama-quantize name, `llama_ftype` value, default tensor type).
const TABLE: &[(FileType, &str, u32, GgmlType)] = &[
    (FileType::F32, "F32", 0, GgmlType::F32),
    (FileType::F16, "F16", 1, GgmlType::F16),
    (FileType::BF16, "BF16", 32, GgmlType::BF16),
    (FileType::Q8_0, "Q8_0", 7, GgmlType::Q8_0),
    (FileType::Q4_0, "Q4_0", 2, GgmlType::Q4_0),
    (FileType::Q4_1, "Q4_1", 3, GgmlType::Q4_1),
    (FileType::Q5_0, "Q5_0", 8, GgmlType::Q5_0),
    (FileType::Q5_1, "Q5_1", 9, GgmlType::Q5_1),
    (FileType::Q2_K, "Q2_K", 10, GgmlType::Q2_K),
    // LLAMA_FTYPE_MOSTLY_Q3_K_M: `Q3_K` is quantize.cpp's alias of Q3_K_M
    (FileType::Q3_K, "Q3_K", 12, GgmlType::Q3_K),
    // LLAMA_FTYPE_MOSTLY_Q4_K_M
    (FileType::Q4_K, "Q4_K", 15, GgmlType::Q4_K),
    // LLAMA_FTYPE_MOSTLY_Q5_K_M
    (FileType::Q5_K, "Q5_K", 17, GgmlType::Q5_K),
    (FileType::Q6_K, "Q6_K", 18, GgmlType::Q6_K),
    (FileType::IQ4_NL, "IQ4_NL", 25, GgmlType::IQ4_NL),
    (FileType::IQ4_XS, "IQ4_XS", 30, GgmlType::IQ4_XS),
];

impl FileType {
    /// Every supported file type, in the order of `models.toml`'s variants (F32 first).
    pub const ALL: [FileType; 15] = [
        FileType::F32,
        FileType::F16,
        FileType::BF16,
        FileType::Q8_0,
        FileType::Q4_0,
        FileType::Q4_1,
        FileType::Q5_0,
        FileType::Q5_1,
        FileType::Q2_K,
        FileType::Q3_K,
        FileType::Q4_K,
        FileType::Q5_K,
        FileType::Q6_K,
        FileType::IQ4_NL,
        FileType::IQ4_XS,
    ];

    fn entry(self) -> &'static (FileType, &'static str, u32, GgmlType) {
        TABLE
            .iter()
            .find(|e| e.0 == self)
            .expect("every FileType has a TABLE entry")
    }

    /// The type named `name` (case-insensitive, as llama-quantize's `try_parse_ftype` upper-cases it).
    ///
    /// Errors: [`Error::Unsupported`] naming `name` and listing the supported names (llama-quantize knows
    /// more — `Q4_K_S`, `IQ2_XXS`, … — which lockstep does not make).
    pub fn parse(name: &str) -> Result<FileType> {
        let upper = name.to_ascii_uppercase();
        TABLE
            .iter()
            .find(|e| e.1 == upper)
            .map(|e| e.0)
            .ok_or_else(|| {
                Error::Unsupported(format!(
                    "quantization type `{name}` is not supported; lockstep makes {}",
                    TABLE.iter().map(|e| e.1).collect::<Vec<_>>().join(" ")
                ))
            })
    }

    /// The llama-quantize name (`Q4_K`, `IQ4_NL`, …).
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    /// The `llama_ftype` number written as `general.file_type` (`LLAMA_FTYPE_MOSTLY_Q4_K_M` = 15 for
    /// `Q4_K`, `LLAMA_FTYPE_ALL_F32` = 0 for `F32`, …).
    pub fn llama_ftype(self) -> u32 {
        self.entry().2
    }

    /// `llama_ftype_get_default_type`: the tensor type a quantizable tensor gets before any fallback.
    pub fn default_type(self) -> GgmlType {
        self.entry().3
    }
}

impl std::fmt::Display for FileType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
