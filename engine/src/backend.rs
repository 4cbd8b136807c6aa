//! The compute seam: matrix products of quantized weights with f32 activations.
//!
//! A [`Backend`] computes `out[t, r] = Σ_k W[r, k] · x[t, k]` for a weight matrix whose rows are ggml
//! blocks read in place from the memory map. [`ScalarBackend`] is the portable reference; a SIMD backend
//! can fill the same seam later (`--simd on`).
//!
//! Threads split output rows (rayon): each output value is computed by one thread with one fixed
//! accumulation order, so results are bit-identical for any thread count.

use rayon::prelude::*;

use crate::quant::{self, GgmlType, NumericsMode, PreparedRow};

/// A weight matrix `[rows, cols]` (ggml `ne = [cols, rows]`) stored as ggml blocks, row-major.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    /// Element type of the blocks.
    pub ty: GgmlType,
    /// Output features (rows).
    pub rows: usize,
    /// Input features (row length in elements).
    pub cols: usize,
    /// `rows · row_bytes` bytes.
    pub data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    /// The raw blocks of row `r`.
    #[inline]
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// Reusable buffers for [`Backend::matmul`]; grows on first use and then allocates nothing.
#[derive(Debug, Default)]
pub struct MatmulScratch {
    prepared: Vec<PreparedRow>,
    /// `[rows, n_tokens]` staging of the transposed result when `n_tokens > 1`.
    staging: Vec<f32>,
}

/// Computes quantized-weight × f32-activation products.
pub trait Backend: Send + Sync {
    /// Short name for reports (`scalar`, `avx2`, ...).
    fn name(&self) -> &'static str;

    /// `out[t · rows + r] = Σ_k W[r, k] · x[t · cols + k]` for `t < n_tokens`.
    /// `x`: `[n_tokens, cols]`; `out`: `[n_tokens, rows]`. Numerics per [`NumericsMode`].
    ///
    /// Errors: the weight type has no kernel ([`crate::Error::Unsupported`]).
    fn matmul(
        &self,
        w: &QMatrix<'_>,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
        mode: NumericsMode,
        scratch: &mut MatmulScratch,
    ) -> crate::Result<()>;
}

/// Portable scalar kernels from [`crate::quant`], rows split across rayon threads.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScalarBackend;

/// Rows per rayon task: large enough to amortise scheduling, small enough to balance two cores.
const ROWS_PER_TASK: usize = 64;

impl Backend for ScalarBackend {
    fn name(&self) -> &'static str {
        "scalar"
    }

    fn matmul(
        &self,
        w: &QMatrix<'_>,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
        mode: NumericsMode,
        scratch: &mut MatmulScratch,
    ) -> crate::Result<()> {
        debug_assert_eq!(x.len(), n_tokens * w.cols);
        debug_assert_eq!(out.len(), n_tokens * w.rows);
        if scratch.prepared.len() < n_tokens {
            scratch.prepared.resize_with(n_tokens, PreparedRow::new);
        }
        for (t, p) in scratch.prepared[..n_tokens].iter_mut().enumerate() {
            p.prepare(w.ty, mode, &x[t * w.cols..(t + 1) * w.cols])?;
        }
        let prepared = &scratch.prepared[..n_tokens];
        // the ggml kernel of each batch row (llama.cpp's choice depends on the batch size)
        let path = |t: usize| quant::ggml_path(w.ty, w.rows, n_tokens, t);
        if n_tokens == 1 {
            let p = path(0);
            out.par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .for_each(|(c, chunk)| {
                    for (i, o) in chunk.iter_mut().enumerate() {
                        let row = w.row(c * ROWS_PER_TASK + i);
                        *o = quant::vec_dot_path(w.ty, row, &prepared[0], p);
                    }
                });
            return Ok(());
        }
        // Row-major over weight rows so each row's blocks are read once for all tokens.
        scratch.staging.resize(w.rows * n_tokens, 0.0);
        scratch
            .staging
            .par_chunks_mut(ROWS_PER_TASK * n_tokens)
            .enumerate()
            .for_each(|(c, chunk)| {
                for (i, row_out) in chunk.chunks_exact_mut(n_tokens).enumerate() {
                    let row = w.row(c * ROWS_PER_TASK + i);
                    for (t, (o, p)) in row_out.iter_mut().zip(prepared).enumerate() {
                        *o = quant::vec_dot_path(w.ty, row, p, path(t));
                    }
                }
            });
        for r in 0..w.rows {
            for t in 0..n_tokens {
                out[t * w.rows + r] = scratch.staging[r * n_tokens + t];
            }
        }
        Ok(())
    }
}
