//! [`PreparedRow`]: an activation row converted once for dot products against many weight rows.

use super::types::GgmlType;
use super::{float, q8, q8_k, vec_dot_type};
use crate::numerics::{NumericsMode, Simd};
use crate::{Error, Result};

/// An activation row prepared once for dot products against many weight rows of one type in one mode.
///
/// - [`NumericsMode::Reference`]: keeps `x` as f32.
/// - [`NumericsMode::Ggml`]: converts `x` to the weight type's `vec_dot_type` exactly as ggml-cpu's mul_mat
///   does before calling `vec_dot` (`type_traits_cpu[vec_dot_type].from_float`): x86 `quantize_row_q8_0` /
///   `quantize_row_q8_1` (Q4_0, Q5_0, Q8_0 / Q4_1 weights), `quantize_row_q8_K` (Q4_K, Q6_K),
///   `ggml_cpu_fp32_to_fp16` (F16), `ggml_cpu_fp32_to_bf16` (BF16), a plain copy (F32). The row keeps both
///   ggml's block bytes ([`PreparedRow::ggml_blocks`]) and the decoded quants the kernels read.
///
/// Reused across calls: [`PreparedRow::prepare`] does not allocate once its buffers are big enough.
#[derive(Clone, Debug, Default)]
pub struct PreparedRow {
    mode: NumericsMode,
    /// The weight type this row was prepared for (`None` before the first `prepare`).
    weight_ty: Option<GgmlType>,
    /// The activation's type: F32 in reference mode, the weight's `vec_dot_type` in ggml mode.
    act_ty: Option<GgmlType>,
    len: usize,
    /// Reference: the input. Ggml with an F32/F16/BF16 `vec_dot_type`: the activation as the kernel reads
    /// it (rounded to f16/bf16 and widened back, which is exact).
    pub(super) x: Vec<f32>,
    /// Ggml: the activation in `vec_dot_type` layout, byte for byte what ggml's `from_float` writes.
    pub(super) blocks: Vec<u8>,
    /// Ggml, Q8_0/Q8_1/Q8_K: the quants.
    pub(crate) qs: Vec<i8>,
    /// Ggml, Q8_0/Q8_1: per-block `d` (f16, widened); Q8_K: per-block `d` (f32).
    pub(crate) d: Vec<f32>,
    /// Ggml, Q8_1: per-block `s = d * sum(qs)` as stored (f16, widened).
    pub(super) s: Vec<f32>,
    /// Ggml, Q8_K: per-16 sums of the quants.
    pub(super) bsums: Vec<i16>,
    /// Ggml, Q8_0: the quants offset to unsigned, `q + 128` (the operand of the AVX-512 VNNI tiles,
    /// `quant::avx512`).
    pub(super) qu: Vec<u8>,
    /// Ggml, Q8_0: some quant is -128 (only a NaN input produces one); the kernels then use the exact
    /// `_mm256_sign_epi8` product.
    pub(crate) has_min_quant: bool,
    /// Prepared for a session that runs SIMD kernels (`prepare_simd`'s `simd`): reference mode's dot
    /// products then take the 16-lane fma order (`reference_fma.rs`), the portable one otherwise.
    pub(super) simd: bool,
}

impl PreparedRow {
    /// An empty row; buffers grow on the first [`PreparedRow::prepare`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Prepare `x` for dot products with rows of `weight_ty` in `mode`.
    ///
    /// Errors: [`Error::Unsupported`] if `weight_ty` has no dot kernel ([`super::supports`]);
    /// [`Error::Invalid`] if `x.len()` is not a whole number of `weight_ty` blocks (and of its
    /// `vec_dot_type`'s blocks in ggml mode).
    pub fn prepare(&mut self, weight_ty: GgmlType, mode: NumericsMode, x: &[f32]) -> Result<()> {
        self.prepare_simd(weight_ty, mode, x, false)
    }

    /// [`PreparedRow::prepare`], with the AVX2 activation quantizer where `simd` is true, the CPU has
    /// AVX2 and one exists for the type (Q8_0: `avx2::quantize_row_q8_0`); the same bytes either way.
    ///
    /// Errors: as [`PreparedRow::prepare`].
    pub fn prepare_simd(
        &mut self,
        weight_ty: GgmlType,
        mode: NumericsMode,
        x: &[f32],
        simd: bool,
    ) -> Result<()> {
        let Some(vdt) = vec_dot_type(weight_ty) else {
            return Err(Error::Unsupported(format!(
                "no dot-product kernel for weight type {weight_ty}"
            )));
        };
        let n = x.len();
        let act_ty = match mode {
            NumericsMode::Reference => GgmlType::F32,
            NumericsMode::Ggml => vdt,
        };
        for ty in [weight_ty, act_ty] {
            if !n.is_multiple_of(ty.block_size()) {
                return Err(Error::Invalid(format!(
                    "activation length {n} is not a multiple of the {ty} block size {}",
                    ty.block_size()
                )));
            }
        }
        self.mode = mode;
        self.simd = simd;
        self.weight_ty = Some(weight_ty);
        self.act_ty = Some(act_ty);
        self.len = n;
        self.has_min_quant = false;
        let nb = n / act_ty.block_size();
        let nbytes = nb * act_ty.type_size();
        match (mode, act_ty) {
            (NumericsMode::Reference, _) => {
                self.blocks.clear();
                set(&mut self.x, x);
            }
            (NumericsMode::Ggml, GgmlType::F32) => {
                resize(&mut self.blocks, nbytes, 0);
                float::quantize_f32(x, &mut self.blocks);
                set(&mut self.x, x);
            }
            (NumericsMode::Ggml, GgmlType::F16) => {
                resize(&mut self.blocks, nbytes, 0);
                resize(&mut self.x, n, 0.0);
                #[cfg(target_arch = "x86_64")]
                if simd && crate::numerics::avx2_available() {
                    // SAFETY: AVX2, FMA and F16C were detected just above; the buffers are sized for x.
                    unsafe { super::avx2_float::round_row_f16(x, &mut self.blocks, &mut self.x) };
                    return Ok(());
                }
                // ggml_cpu_fp32_to_fp16: F16C with round to nearest even, as `half` (see fp.rs)
                for (b, &v) in self.blocks.chunks_exact_mut(2).zip(x) {
                    b.copy_from_slice(&super::fp::f32_to_f16_cpu(v).to_le_bytes());
                }
                float::dequantize_f16(&self.blocks, &mut self.x);
            }
            (NumericsMode::Ggml, GgmlType::BF16) => {
                resize(&mut self.blocks, nbytes, 0);
                float::quantize_bf16(x, &mut self.blocks);
                resize(&mut self.x, n, 0.0);
                float::dequantize_bf16(&self.blocks, &mut self.x);
            }
            (NumericsMode::Ggml, GgmlType::Q8_0) => {
                resize(&mut self.blocks, nbytes, 0);
                resize(&mut self.qs, n, 0);
                resize(&mut self.d, nb, 0.0);
                #[cfg(target_arch = "x86_64")]
                if simd && crate::numerics::avx2_available() {
                    resize(&mut self.qu, n, 0);
                    let (b, q, u, d) = (&mut self.blocks, &mut self.qs, &mut self.qu, &mut self.d);
                    // SAFETY: AVX2, FMA and F16C were detected just above; the buffers are sized for x.
                    self.has_min_quant = unsafe { super::avx2::quantize_row_q8_0(x, b, q, u, d) };
                    return Ok(());
                }
                let _ = simd;
                self.has_min_quant =
                    q8::quantize_act_q8_0(x, &mut self.blocks, &mut self.qs, &mut self.d);
                self.qu.clear();
                self.qu.extend(self.qs.iter().map(|&q| (q as u8) ^ 0x80));
            }
            (NumericsMode::Ggml, GgmlType::Q8_1) => {
                resize(&mut self.blocks, nbytes, 0);
                resize(&mut self.qs, n, 0);
                resize(&mut self.d, nb, 0.0);
                resize(&mut self.s, nb, 0.0);
                q8::quantize_act_q8_1(x, &mut self.blocks, &mut self.qs, &mut self.d, &mut self.s);
            }
            (NumericsMode::Ggml, GgmlType::Q8_K) => {
                resize(&mut self.blocks, nbytes, 0);
                resize(&mut self.qs, n, 0);
                resize(&mut self.d, nb, 0.0);
                resize(&mut self.bsums, nb * 16, 0);
                q8_k::quantize(
                    x,
                    &mut self.blocks,
                    &mut self.qs,
                    &mut self.d,
                    &mut self.bsums,
                );
            }
            (NumericsMode::Ggml, other) => {
                unreachable!("vec_dot_type returned {other}, which has no activation conversion")
            }
        }
        Ok(())
    }

    /// Prepare `x` for reference-mode dot products with rows of `weight_ty` after rounding it as
    /// llama.cpp rounds every matmul input: converted to the weight type's `vec_dot_type` exactly as
    /// [`NumericsMode::Ggml`] does (Q8_0, Q8_1, Q8_K, F16, BF16; F32 unchanged) and dequantized back to f32
    /// (`dequantize_row_q8_0` etc.); the dot products then run in reference mode (f32 accumulation).
    ///
    /// This is a probe, not a numerics mode of its own: the reference computation with llama.cpp's input
    /// rounding and nothing else of ggml's, to measure how much of a reference-vs-llama.cpp gap that
    /// rounding explains (`lockstep run`'s rounding probe).
    ///
    /// Errors: as [`PreparedRow::prepare`] in ggml mode.
    pub fn prepare_rounded(&mut self, weight_ty: GgmlType, x: &[f32], simd: bool) -> Result<()> {
        self.prepare_simd(weight_ty, NumericsMode::Ggml, x, simd)?;
        let act_ty = self.act_ty.unwrap_or(GgmlType::F32);
        if matches!(act_ty, GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8_K) {
            resize(&mut self.x, x.len(), 0.0);
            // the portable dequantizer with SIMD off (`simd` false), the AVX2 one (where the CPU has
            // it) with any SIMD setting: the same values
            let setting = if simd { Simd::Avx2 } else { Simd::Off };
            super::dequantize_row_with(act_ty, &self.blocks, &mut self.x, setting)?;
        }
        // F32/F16/BF16: `x` already holds the activation as the kernel reads it
        self.mode = NumericsMode::Reference;
        self.act_ty = Some(GgmlType::F32);
        self.blocks.clear();
        self.has_min_quant = false;
        Ok(())
    }

    /// Number of per-block scales prepared (`d`: the blocks of a Q8_0/Q8_1/Q8_K row; 0 in reference
    /// mode and for float activation types).
    pub(crate) fn n_blocks(&self) -> usize {
        self.d.len()
    }

    /// Reference mode: the activation as given (`len()` f32). Ggml mode with an F32/F16/BF16
    /// `vec_dot_type`: the activation rounded to that type and widened; otherwise empty.
    pub(crate) fn x(&self) -> &[f32] {
        &self.x[..self.x.len().min(self.len)]
    }

    /// Number of activation elements prepared.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first `prepare` or after preparing an empty row.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mode this row was prepared in.
    pub fn mode(&self) -> NumericsMode {
        self.mode
    }

    /// The weight type this row was prepared for (`None` before the first `prepare`).
    pub fn weight_type(&self) -> Option<GgmlType> {
        self.weight_ty
    }

    /// The activation's type: F32 in reference mode, the weight type's `vec_dot_type` in ggml mode.
    pub fn activation_type(&self) -> Option<GgmlType> {
        self.act_ty
    }

    /// Ggml mode: the activation in its `vec_dot_type` block layout, byte for byte what ggml-cpu's
    /// `from_float` produces for the same input. `None` in reference mode.
    pub fn ggml_blocks(&self) -> Option<(GgmlType, &[u8])> {
        match (self.mode, self.act_ty) {
            (NumericsMode::Ggml, Some(t)) => Some((t, &self.blocks)),
            _ => None,
        }
    }
}

/// `v = src` without shrinking the allocation.
fn set<T: Copy>(v: &mut Vec<T>, src: &[T]) {
    v.clear();
    v.extend_from_slice(src);
}

/// Resize without shrinking the allocation. The contents are left as they were (only elements added
/// past the old length are written): every caller overwrites all `n`, so clearing first would only
/// write each buffer twice per token and matmul.
fn resize<T: Copy>(v: &mut Vec<T>, n: usize, fill: T) {
    v.resize(n, fill);
}
