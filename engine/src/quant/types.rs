//! The ggml type table: ids, names, block sizes and bytes per block.
//!
//! Mirrors `enum ggml_type` in ggml/include/ggml.h and `type_traits[]` (`blck_size`, `type_size`) in
//! ggml/src/ggml.c. Every type a GGUF file may name is listed so that the parser can check tensor byte
//! ranges even for types whose kernels this engine does not implement.

/// A ggml tensor element type, as stored in a GGUF tensor-info record (u32 id).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// (type, ggml id, name, elements per block, bytes per block), from ggml.h / ggml.c `type_traits`.
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2_K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3_K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4_K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5_K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6_K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8_K, 15, "Q8_K", 256, 292),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", 256, 66),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", 256, 74),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", 256, 98),
    (GgmlType::IQ1_S, 19, "IQ1_S", 256, 50),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3_S, 21, "IQ3_S", 256, 110),
    (GgmlType::IQ2_S, 22, "IQ2_S", 256, 82),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", 256, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
];

impl GgmlType {
    fn entry(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE
            .iter()
            .find(|e| e.0 == self)
            .expect("every GgmlType variant has a TABLE entry")
    }

    /// The type for a ggml id, or `None` for an id ggml does not define (or has retired).
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    /// The ggml id (`enum ggml_type` value).
    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// ggml's name for the type (`Q4_K`, `F16`, ...).
    pub fn name(self) -> &'static str {
        self.entry().2
    }

    /// Elements per block (`blck_size`): 1 for plain types, 32 for Q4_0 .. Q8_1, 256 for K-quants.
    pub fn block_size(self) -> usize {
        self.entry().3
    }

    /// Bytes per block (`type_size`).
    pub fn type_size(self) -> usize {
        self.entry().4
    }

    /// Bytes taken by `n_elements` elements, or `None` if `n_elements` is not a whole number of blocks or
    /// the size overflows `usize`.
    pub fn bytes_for(self, n_elements: u64) -> Option<usize> {
        let bs = self.block_size() as u64;
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        let bytes = (n_elements / bs).checked_mul(self.type_size() as u64)?;
        usize::try_from(bytes).ok()
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for e in TABLE {
            assert_eq!(GgmlType::from_id(e.1), Some(e.0));
            assert_eq!(e.0.id(), e.1);
        }
        assert_eq!(GgmlType::from_id(4), None, "Q4_2 was retired");
        assert_eq!(GgmlType::from_id(1000), None);
    }

    #[test]
    fn bytes_for_checks_block_multiples() {
        assert_eq!(GgmlType::Q4_1.bytes_for(64), Some(40));
        assert_eq!(GgmlType::Q4_1.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(3), Some(12));
        assert_eq!(GgmlType::Q8_0.bytes_for(u64::MAX - 31), None);
    }
}
