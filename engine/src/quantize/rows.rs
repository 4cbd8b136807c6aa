//! Tensor data conversion: dequantize a source tensor to f32 and quantize f32 rows to a target type,
//! parallel over rows (rayon).
//!
//! Mirrors what `llama_model_quantize_impl` (src/llama-quant.cpp) does per tensor:
//! `llama_tensor_dequantize_impl` (the type's `to_float`, `ggml_fp16_to_fp32_row`,
//! `ggml_bf16_to_fp32_row`) and `llama_tensor_quantize_impl` → `ggml_quantize_chunk` (ggml.c) without an
//! importance matrix. Every quantizer works block by block, so how rows are split among threads changes no
//! byte (llama.cpp splits in chunks of at least 32×512 elements; so does this).

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::quant::{self, GgmlType};

/// Elements per parallel task, at least (llama-quant.cpp `min_chunk_size`).
const MIN_CHUNK: usize = 32 * 512;

/// Whether `ty` can be produced here: the fifteen types of lockstep's variants.
///
/// Errors: [`Error::Unsupported`] naming `ty` for any other type.
pub fn check_quantizer(ty: GgmlType) -> Result<()> {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL | Q2_K | Q3_K | Q4_K | Q5_K
        | Q6_K | IQ4_XS => Ok(()),
        _ => Err(Error::Unsupported(format!(
            "quantizing to {ty} is not supported (lockstep makes F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 \
             Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS)"
        ))),
    }
}

/// Rows per parallel task for rows of `n_per_row` elements.
fn rows_per_task(n_per_row: usize) -> usize {
    MIN_CHUNK.div_ceil(n_per_row.max(1)).max(1)
}

/// Dequantizes `src` (rows of `n_per_row` elements of `ty`, `dst.len() / n_per_row` of them) into `dst`,
/// exactly as ggml's `to_float` does.
///
/// Errors: [`Error::Invalid`] when the sizes do not agree; [`Error::Unsupported`] for a type without a
/// dequantizer.
pub fn dequantize_rows(ty: GgmlType, src: &[u8], n_per_row: usize, dst: &mut [f32]) -> Result<()> {
    let row_bytes = ty.bytes_for(n_per_row as u64).ok_or_else(|| {
        Error::Invalid(format!(
            "{ty}: a row of {n_per_row} elements is not a whole number of blocks"
        ))
    })?;
    if n_per_row == 0
        || !dst.len().is_multiple_of(n_per_row)
        || src.len() != dst.len() / n_per_row * row_bytes
    {
        return Err(Error::Invalid(format!(
            "{ty}: {} bytes do not hold {} elements in rows of {n_per_row}",
            src.len(),
            dst.len()
        )));
    }
    let rows = rows_per_task(n_per_row);
    src.par_chunks(rows * row_bytes)
        .zip(dst.par_chunks_mut(rows * n_per_row))
        .try_for_each(|(s, d)| quant::dequantize_row(ty, s, d))
}

/// Quantizes `src` (rows of `n_per_row` elements) to `ty` into `dst` (`ty`'s bytes for all of them):
/// `ggml_quantize_chunk` without an importance matrix, rows split among rayon's threads.
///
/// Errors: [`check_quantizer`]'s; [`Error::Invalid`] when the sizes do not agree.
pub fn quantize_rows(ty: GgmlType, src: &[f32], n_per_row: usize, dst: &mut [u8]) -> Result<()> {
    check_quantizer(ty)?;
    let row_bytes = ty.bytes_for(n_per_row as u64).ok_or_else(|| {
        Error::Invalid(format!(
            "{ty}: a row of {n_per_row} elements is not a whole number of blocks"
        ))
    })?;
    if n_per_row == 0
        || !src.len().is_multiple_of(n_per_row)
        || dst.len() != src.len() / n_per_row * row_bytes
    {
        return Err(Error::Invalid(format!(
            "{ty}: {} elements in rows of {n_per_row} do not fill {} bytes",
            src.len(),
            dst.len()
        )));
    }
    let rows = rows_per_task(n_per_row);
    src.par_chunks(rows * n_per_row)
        .zip(dst.par_chunks_mut(rows * row_bytes))
        .try_for_each(|(s, d)| quant::quantize_into(ty, s, d))
}
