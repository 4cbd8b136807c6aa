//! One descriptor per ggml type, and the one table every dispatch of this module indexes: the role of
//! ggml's `type_traits` (ggml/src/ggml.c: block size, type size, `to_float`, `from_float_ref`) and
//! `type_traits_cpu` (ggml/src/ggml-cpu/ggml-cpu.c: `vec_dot`, `vec_dot_type`, `from_float`), plus the
//! kernels of the other matmul paths llama.cpp takes on x86 (repacked, tiled, tinyBLAS) and the SIMD
//! kernels of this engine.
//!
//! A row is built here from its type's own module (`q4_0`, `q4_k`, …), which names nothing of this
//! table: a descriptor defined inside `q4_0.rs` would make `q4_0` and the table name each other (an
//! import cycle `harness/tests/module_graph.rs` refuses). Adding a type is its module plus one `const`
//! row and one arm of [`traits`]; every dispatch ([`super::dequantize_row`], [`super::quantize_into`],
//! [`super::vec_dot_type`], [`super::vec_dot`], [`super::vec_dot_path`], [`super::ggml_path`],
//! [`super::simd_kernel`]) reads the row, so a half-described type fails to compile (a missing field)
//! instead of returning NaN.

use super::prepared::PreparedRow;
use super::reference;
use super::types::GgmlType;
use super::SimdKernel;
use super::{
    float, fp, iq4_nl, iq4_xs, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8, q8_k,
};
use crate::numerics::GgmlTarget;

/// What the engine knows about one ggml type. Lengths are the caller's contract everywhere: the
/// dispatchers in `quant/mod.rs` check them once ([`super::dequantize_row`]: whole blocks, matching sizes).
pub(crate) struct TypeTraits {
    /// The type described.
    pub ty: GgmlType,
    /// `dequantize_row_<type>` (ggml-quants.c; `ggml_fp16_to_fp32_row` etc. for the float types): a whole
    /// number of blocks in, their elements out.
    pub dequantize: fn(&[u8], &mut [f32]),
    /// `quantize_row_<type>_ref` / `quantize_<type>` without an importance matrix (ggml-quants.c): the
    /// quantizer that writes model files ([`super::quantize_into`]).
    pub quantize: fn(&[f32], &mut [u8]),
    /// The dot products of weights of this type; `None` for the activation-only types (Q8_1, Q8_K),
    /// which a model's weight may not have ([`super::supports`]).
    pub dot: Option<Dots>,
}

/// The dot-product kernels of a weight type, per numerics mode and ggml-cpu path.
pub(crate) struct Dots {
    /// `type_traits_cpu[ty].vec_dot_type`: the type ggml-cpu converts the activation to.
    pub vec_dot_type: GgmlType,
    /// Reference mode with SIMD off: `(weight row, f32 activation) → Σ w·x` in the portable order of
    /// `reference.rs` (with SIMD on, [`super::vec_dot`] dequantizes and takes `reference_fma.rs`'s order).
    pub reference: fn(&[u8], &[f32]) -> f32,
    /// Ggml mode, `ggml_vec_dot_<type>_<vec_dot_type>` (arch/x86/quants.c; vec.cpp for floats).
    pub ggml: fn(&[u8], &PreparedRow) -> f32,
    /// The repacked layout (`CPU_REPACK`, ggml-cpu/repack.cpp), if llama.cpp repacks this type on x86.
    pub repack: Option<Repack>,
    /// ggml-cpu/tiled (`ggml_tiled_supported`), if this type takes it.
    pub tiled: Option<fn(&[u8], &PreparedRow) -> f32>,
    /// llamafile's `tinyBLAS_Q0_AVX` where its arithmetic differs from `ggml` ([`super::GgmlPath::TinyBlasQ0`]).
    pub tinyblas_q0: Option<fn(&[u8], &PreparedRow) -> f32>,
    /// The float weights' build-dependent kernels (F32, F16, BF16).
    pub float: Option<FloatPaths>,
    /// The AVX2 kernel of this type ([`super::simd_kernel`] under `Simd::Avx2`/`Avx512`), if any.
    pub simd_avx2: Option<SimdKernel>,
    /// The AVX-512 VNNI kernel, if any (otherwise `Simd::Avx512` runs `simd_avx2`).
    pub simd_avx512: Option<SimdKernel>,
}

/// A repacked weight type: `ggml_repack_get_optimal_repack_type` (ggml-cpu/repack.cpp) picks it on
/// the targets where `on` is true (for rows divisible by 8).
pub(crate) struct Repack {
    /// True if an x86 build for this target repacks the type.
    pub on: fn(GgmlTarget) -> bool,
    /// `ggml_gemm_*` (`gemm` true) or `ggml_gemv_*` (arch/x86/repack.cpp) for one output.
    pub dot: fn(&[u8], &PreparedRow, bool) -> f32,
}

/// The F32/F16/BF16 kernels that depend on the ggml-cpu build (`float.rs`).
pub(crate) struct FloatPaths {
    /// tinyBLAS of an AVX-512 build ([`super::GgmlPath::TinyBlas`]; BF16: with AVX512-BF16).
    pub tinyblas: fn(&[u8], &[f32]) -> f32,
    /// tinyBLAS of an AVX2 build ([`super::GgmlPath::TinyBlasAvx2`]).
    pub tinyblas_avx2: fn(&[u8], &[f32]) -> f32,
    /// `ggml_vec_dot_<float>` of an AVX2 build ([`super::GgmlPath::VecDotAvx2`]).
    pub vec_dot_avx2: fn(&[u8], &[f32]) -> f32,
    /// The kernels of an AVX-512 build without AVX512-BF16 ([`GgmlTarget::Avx512NoBf16`]) where they
    /// differ from those of one with it (BF16's); `None` for F32 and F16, which both builds compute alike.
    pub avx512_nobf16: Option<NoBf16Kernels>,
}

/// BF16's kernels of an AVX-512 build without `__AVX512BF16__` (`float.rs`).
pub(crate) struct NoBf16Kernels {
    /// `tinyBLAS<16, __m512, __m512, ggml_bf16_t, ...>` ([`super::GgmlPath::TinyBlasNoBf16`]).
    pub tinyblas: fn(&[u8], &[f32]) -> f32,
    /// `ggml_vec_dot_bf16`'s `__AVX512F__` branch ([`super::GgmlPath::VecDotNoBf16`]).
    pub vec_dot: fn(&[u8], &[f32]) -> f32,
}

/// The descriptor of `ty`, or `None` for a type this engine has no kernels for (the IQ2/IQ3/IQ1, TQ,
/// MXFP4 and integer types). Callers turn `None` into an error naming the type (and, at model load, the
/// tensor: `models::weights`).
pub(crate) fn traits(ty: GgmlType) -> Option<&'static TypeTraits> {
    use GgmlType::*;
    let row = match ty {
        F32 => &F32_TRAITS,
        F16 => &F16_TRAITS,
        BF16 => &BF16_TRAITS,
        Q4_0 => &Q4_0_TRAITS,
        Q4_1 => &Q4_1_TRAITS,
        Q5_0 => &Q5_0_TRAITS,
        Q5_1 => &Q5_1_TRAITS,
        Q8_0 => &Q8_0_TRAITS,
        Q8_1 => &Q8_1_TRAITS,
        IQ4_NL => &IQ4_NL_TRAITS,
        Q2_K => &Q2_K_TRAITS,
        Q3_K => &Q3_K_TRAITS,
        Q4_K => &Q4_K_TRAITS,
        Q5_K => &Q5_K_TRAITS,
        Q6_K => &Q6_K_TRAITS,
        IQ4_XS => &IQ4_XS_TRAITS,
        Q8_K => &Q8_K_TRAITS,
        _ => return None,
    };
    debug_assert_eq!(row.ty, ty, "the row filed under {ty} describes {}", row.ty);
    Some(row)
}

/// `dequantize_block` of a `QK`-element, `BYTES`-byte block applied to a whole row; on a CPU with AVX2
/// the same loop compiled with AVX2 enabled (the block function inlined into it: wider vectors for the
/// same operations, and Rust never contracts `a * b + c` into an fma, so the same values).
macro_rules! blocks {
    ($qk:expr, $bytes:expr, $deq:path) => {{
        #[inline(always)]
        fn each(src: &[u8], dst: &mut [f32]) {
            for (blk, out) in src.chunks_exact($bytes).zip(dst.chunks_exact_mut($qk)) {
                let out: &mut [f32; $qk] = out.try_into().expect("chunks_exact gives QK elements");
                $deq(blk, out);
            }
        }
        fn dequantize(src: &[u8], dst: &mut [f32]) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2(src: &[u8], dst: &mut [f32]) {
                    each(src, dst)
                }
                if crate::numerics::cpu_has("avx2") {
                    // SAFETY: the CPU has AVX2 (checked above)
                    return unsafe { avx2(src, dst) };
                }
            }
            each(src, dst)
        }
        dequantize
    }};
}

/// The portable reference dot of a block type: [`reference::dot_blocks`] over its `dequantize_block`.
macro_rules! reference_blocks {
    ($qk:expr, $bytes:expr, $deq:path) => {{
        fn dot(w: &[u8], x: &[f32]) -> f32 {
            reference::dot_blocks::<$qk>(w, $bytes, x, $deq)
        }
        dot
    }};
}

/// A descriptor's [`Dots`] with no special path and no SIMD kernel (the fields rows override).
const fn plain(
    vec_dot_type: GgmlType,
    reference: fn(&[u8], &[f32]) -> f32,
    ggml: fn(&[u8], &PreparedRow) -> f32,
) -> Dots {
    Dots {
        vec_dot_type,
        reference,
        ggml,
        repack: None,
        tiled: None,
        tinyblas_q0: None,
        float: None,
        simd_avx2: None,
        simd_avx512: None,
    }
}

// ---- float types (float.rs) ----

const F32_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::F32,
    dequantize: float::dequantize_f32,
    quantize: float::quantize_f32,
    dot: Some(Dots {
        float: Some(FloatPaths {
            tinyblas: |w, x| float::dot_tinyblas(GgmlType::F32, w, x),
            tinyblas_avx2: |w, x| float::dot_tinyblas_avx2(GgmlType::F32, w, x),
            vec_dot_avx2: float::dot_f32_avx2,
            avx512_nobf16: None,
        }),
        simd_avx2: Some(SimdKernel::F32Avx2),
        ..plain(
            GgmlType::F32,
            |w, x| reference::dot_elems(w, 4, x, |b| fp::read_f32(b, 0)),
            |w, x| float::dot_f32(w, &x.x),
        )
    }),
};

const F16_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::F16,
    dequantize: float::dequantize_f16,
    quantize: float::quantize_f16,
    dot: Some(Dots {
        float: Some(FloatPaths {
            tinyblas: |w, x| float::dot_tinyblas(GgmlType::F16, w, x),
            tinyblas_avx2: |w, x| float::dot_tinyblas_avx2(GgmlType::F16, w, x),
            vec_dot_avx2: float::dot_f16_avx2,
            avx512_nobf16: None,
        }),
        simd_avx2: Some(SimdKernel::F16Avx2),
        ..plain(
            GgmlType::F16,
            |w, x| reference::dot_elems(w, 2, x, |b| fp::f16_to_f32(fp::read_u16(b, 0))),
            |w, x| float::dot_f16(w, &x.x),
        )
    }),
};

const BF16_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::BF16,
    dequantize: float::dequantize_bf16,
    quantize: float::quantize_bf16,
    dot: Some(Dots {
        float: Some(FloatPaths {
            tinyblas: |w, x| float::dot_tinyblas(GgmlType::BF16, w, x),
            tinyblas_avx2: |w, x| float::dot_tinyblas_avx2(GgmlType::BF16, w, x),
            vec_dot_avx2: float::dot_bf16_avx2,
            avx512_nobf16: Some(NoBf16Kernels {
                tinyblas: float::dot_tinyblas_bf16_avx512f,
                vec_dot: float::dot_bf16_avx512f,
            }),
        }),
        simd_avx2: Some(SimdKernel::BF16Avx2),
        simd_avx512: Some(SimdKernel::BF16Avx512),
        ..plain(
            GgmlType::BF16,
            |w, x| reference::dot_elems(w, 2, x, |b| fp::bf16_to_f32(fp::read_u16(b, 0))),
            |w, x| float::dot_bf16(w, &x.x),
        )
    }),
};

// ---- 32-element blocks with Q8_0 / Q8_1 activations ----

const Q4_0_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q4_0,
    dequantize: blocks!(32, q4_0::BYTES, q4_0::dequantize_block),
    quantize: q4_0::quantize_row_ref,
    dot: Some(Dots {
        repack: Some(Repack {
            on: |_| true,
            dot: |w, x, gemm| q4_0::dot_q8_0_repacked(w, &x.qs, &x.d, !gemm),
        }),
        simd_avx2: Some(SimdKernel::Q4_0Avx2),
        simd_avx512: Some(SimdKernel::Q4_0Avx512),
        ..plain(
            GgmlType::Q8_0,
            reference_blocks!(32, q4_0::BYTES, q4_0::dequantize_block),
            |w, x| match x.has_min_quant {
                true => q4_0::dot_q8_0::<true>(w, &x.qs, &x.d),
                false => q4_0::dot_q8_0::<false>(w, &x.qs, &x.d),
            },
        )
    }),
};

const Q4_1_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q4_1,
    dequantize: blocks!(32, q4_1::BYTES, q4_1::dequantize_block),
    quantize: q4_1::quantize_row_ref,
    dot: Some(Dots {
        simd_avx2: Some(SimdKernel::Q4_1Avx2),
        simd_avx512: Some(SimdKernel::Q4_1Avx512),
        ..plain(
            GgmlType::Q8_1,
            reference_blocks!(32, q4_1::BYTES, q4_1::dequantize_block),
            |w, x| q4_1::dot_q8_1(w, &x.qs, &x.d, &x.s),
        )
    }),
};

const Q5_0_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q5_0,
    dequantize: blocks!(32, q5_0::BYTES, q5_0::dequantize_block),
    quantize: q5_0::quantize_row_ref,
    dot: Some(Dots {
        simd_avx2: Some(SimdKernel::Q5_0Avx2),
        simd_avx512: Some(SimdKernel::Q5_0Avx512),
        ..plain(
            GgmlType::Q8_0,
            reference_blocks!(32, q5_0::BYTES, q5_0::dequantize_block),
            |w, x| match x.has_min_quant {
                true => q5_0::dot_q8_0::<true>(w, &x.qs, &x.d),
                false => q5_0::dot_q8_0::<false>(w, &x.qs, &x.d),
            },
        )
    }),
};

const Q5_1_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q5_1,
    dequantize: blocks!(32, q5_1::BYTES, q5_1::dequantize_block),
    quantize: q5_1::quantize_row_ref,
    dot: Some(Dots {
        simd_avx2: Some(SimdKernel::Q5_1Avx2),
        ..plain(
            GgmlType::Q8_1,
            reference_blocks!(32, q5_1::BYTES, q5_1::dequantize_block),
            |w, x| q5_1::dot_q8_1(w, &x.qs, &x.d, &x.s),
        )
    }),
};

const Q8_0_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q8_0,
    dequantize: blocks!(32, q8::Q8_0_BYTES, q8::dequantize_block_q8_0),
    quantize: q8::quantize_ref_q8_0,
    dot: Some(Dots {
        simd_avx2: Some(SimdKernel::Q8_0Avx2),
        simd_avx512: Some(SimdKernel::Q8_0Avx512),
        ..plain(
            GgmlType::Q8_0,
            reference_blocks!(32, q8::Q8_0_BYTES, q8::dequantize_block_q8_0),
            |w, x| match x.has_min_quant {
                true => q8::dot_q8_0_q8_0::<true>(w, &x.qs, &x.d),
                false => q8::dot_q8_0_q8_0::<false>(w, &x.qs, &x.d),
            },
        )
    }),
};

/// Q8_1: an activation type (the `vec_dot_type` of Q4_1 and Q5_1), no dot kernel of its own.
const Q8_1_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q8_1,
    dequantize: blocks!(32, q8::Q8_1_BYTES, q8::dequantize_block_q8_1),
    quantize: q8::quantize_ref_q8_1,
    dot: None,
};

const IQ4_NL_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::IQ4_NL,
    dequantize: blocks!(32, iq4_nl::BYTES, iq4_nl::dequantize_block),
    quantize: iq4_nl::quantize_row_ref,
    dot: Some(Dots {
        repack: Some(Repack {
            on: |_| true,
            dot: |w, x, gemm| q4_0::dot_q8_0_repacked_lut(w, &x.qs, &x.d, !gemm, &iq4_nl::KVALUES),
        }),
        tinyblas_q0: Some(|w, x| match x.has_min_quant {
            true => iq4_nl::dot_q8_0_tinyblas::<true>(w, &x.qs, &x.d),
            false => iq4_nl::dot_q8_0_tinyblas::<false>(w, &x.qs, &x.d),
        }),
        simd_avx2: Some(SimdKernel::IQ4_NLAvx2),
        simd_avx512: Some(SimdKernel::IQ4_NLAvx512),
        ..plain(
            GgmlType::Q8_0,
            reference_blocks!(32, iq4_nl::BYTES, iq4_nl::dequantize_block),
            |w, x| match x.has_min_quant {
                true => iq4_nl::dot_q8_0::<true>(w, &x.qs, &x.d),
                false => iq4_nl::dot_q8_0::<false>(w, &x.qs, &x.d),
            },
        )
    }),
};

// ---- 256-element super-blocks with Q8_K activations ----

const Q2_K_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q2_K,
    dequantize: blocks!(256, q2_k::BYTES, q2_k::dequantize_block),
    quantize: q2_k::quantize_row_ref,
    dot: Some(Dots {
        // `q2_K_8x8_q8_K` only if `ggml_cpu_has_avx512()`
        repack: Some(Repack {
            on: GgmlTarget::is_avx512,
            dot: |w, x, gemm| q2_k::dot_q8_k_repacked(w, &x.qs, &x.d, &x.bsums, gemm),
        }),
        tiled: Some(|w, x| q2_k::dot_q8_k_tiled(w, &x.qs, &x.d, &x.bsums)),
        simd_avx2: Some(SimdKernel::Q2_KAvx2),
        simd_avx512: Some(SimdKernel::Q2_KAvx512),
        ..plain(
            GgmlType::Q8_K,
            reference_blocks!(256, q2_k::BYTES, q2_k::dequantize_block),
            |w, x| q2_k::dot_q8_k(w, &x.qs, &x.d, &x.bsums),
        )
    }),
};

const Q3_K_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q3_K,
    dequantize: blocks!(256, q3_k::BYTES, q3_k::dequantize_block),
    quantize: q3_k::quantize_row_ref,
    dot: Some(Dots {
        tiled: Some(|w, x| q3_k::dot_q8_k_tiled(w, &x.qs, &x.d)),
        simd_avx2: Some(SimdKernel::Q3_KAvx2),
        simd_avx512: Some(SimdKernel::Q3_KAvx512),
        ..plain(
            GgmlType::Q8_K,
            reference_blocks!(256, q3_k::BYTES, q3_k::dequantize_block),
            |w, x| q3_k::dot_q8_k(w, &x.qs, &x.d),
        )
    }),
};

const Q4_K_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q4_K,
    dequantize: blocks!(256, q4_k::BYTES, q4_k::dequantize_block),
    quantize: q4_k::quantize_row_ref,
    dot: Some(Dots {
        repack: Some(Repack {
            on: |_| true,
            dot: |w, x, gemm| q4_k::dot_q8_k_repacked(w, &x.qs, &x.d, &x.bsums, gemm),
        }),
        tiled: Some(|w, x| q4_k::dot_q8_k_tiled(w, &x.qs, &x.d, &x.bsums)),
        simd_avx2: Some(SimdKernel::Q4_KAvx2),
        simd_avx512: Some(SimdKernel::Q4_KAvx512),
        ..plain(
            GgmlType::Q8_K,
            reference_blocks!(256, q4_k::BYTES, q4_k::dequantize_block),
            |w, x| q4_k::dot_q8_k(w, &x.qs, &x.d, &x.bsums),
        )
    }),
};

const Q5_K_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q5_K,
    dequantize: blocks!(256, q5_k::BYTES, q5_k::dequantize_block),
    quantize: q5_k::quantize_row_ref,
    dot: Some(Dots {
        tiled: Some(|w, x| q5_k::dot_q8_k_tiled(w, &x.qs, &x.d, &x.bsums)),
        simd_avx2: Some(SimdKernel::Q5_KAvx2),
        simd_avx512: Some(SimdKernel::Q5_KAvx512),
        ..plain(
            GgmlType::Q8_K,
            reference_blocks!(256, q5_k::BYTES, q5_k::dequantize_block),
            |w, x| q5_k::dot_q8_k(w, &x.qs, &x.d, &x.bsums),
        )
    }),
};

const Q6_K_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q6_K,
    dequantize: blocks!(256, q6_k::BYTES, q6_k::dequantize_block),
    quantize: q6_k::quantize_row_ref,
    dot: Some(Dots {
        tiled: Some(|w, x| q6_k::dot_q8_k_tiled(w, &x.qs, &x.d)),
        simd_avx2: Some(SimdKernel::Q6_KAvx2),
        simd_avx512: Some(SimdKernel::Q6_KAvx512),
        ..plain(
            GgmlType::Q8_K,
            reference_blocks!(256, q6_k::BYTES, q6_k::dequantize_block),
            |w, x| q6_k::dot_q8_k(w, &x.qs, &x.d, &x.bsums),
        )
    }),
};

const IQ4_XS_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::IQ4_XS,
    dequantize: blocks!(256, iq4_xs::BYTES, iq4_xs::dequantize_block),
    quantize: iq4_xs::quantize_row_ref,
    dot: Some(Dots {
        tiled: Some(|w, x| iq4_xs::dot_q8_k_tiled(w, &x.qs, &x.d)),
        simd_avx2: Some(SimdKernel::IQ4_XSAvx2),
        ..plain(
            GgmlType::Q8_K,
            reference_blocks!(256, iq4_xs::BYTES, iq4_xs::dequantize_block),
            |w, x| iq4_xs::dot_q8_k(w, &x.qs, &x.d),
        )
    }),
};

/// Q8_K: the activation type of the K-quants and IQ4_XS, no dot kernel of its own.
const Q8_K_TRAITS: TypeTraits = TypeTraits {
    ty: GgmlType::Q8_K,
    dequantize: blocks!(256, q8_k::BYTES, q8_k::dequantize_block),
    quantize: q8_k::quantize_row_ref,
    dot: None,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row describes the type it is filed under, and its block layout agrees with `types.rs`.
    #[test]
    fn each_row_describes_its_own_type() {
        let mut described = 0;
        for ty in (0..64).filter_map(GgmlType::from_id) {
            if let Some(t) = traits(ty) {
                described += 1;
                assert_eq!(t.ty, ty);
                let row = vec![0u8; ty.bytes_for(ty.block_size() as u64).unwrap()];
                let mut out = vec![f32::NAN; ty.block_size()];
                (t.dequantize)(&row, &mut out);
                assert!(
                    out.iter().all(|v| *v == 0.0),
                    "{ty}: zero bytes dequantize to 0"
                );
                assert_eq!(t.dot.is_some(), super::super::supports(ty), "{ty}");
            }
        }
        assert_eq!(described, 17, "the types of quant/mod.rs's table");
    }
}
