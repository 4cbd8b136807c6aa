//! Weight handles: 2-D matrices that stay quantized in the memory map, and small 1-D vectors (norm
//! weights, biases) copied to f32 at load. Every lookup checks shape and type and names the file and
//! tensor on error.

use crate::backend::QMatrix;
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant;
use crate::{Error, Result};

/// A 2-D weight as it lies in the model file: `[rows, cols]` (ggml `ne = [cols, rows]`).
#[derive(Clone, Debug)]
pub struct Weight {
    /// The GGUF tensor record (name, type, absolute offset, size).
    pub info: TensorInfo,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// The load-time repacked copy of a Q4_0 or IQ4_NL matrix (`quant::q4_0x8`, `quant::iq4_nlx8`), made by the backend on the first
    /// product that runs the repacked kernels and kept for the model's life (shared by its clones).
    repacked: std::sync::Arc<std::sync::OnceLock<Vec<u8>>>,
}

impl Weight {
    /// Look up a 2-D tensor and check its shape is `[rows, cols]` (either may be `None` = any) and that the
    /// engine has kernels for its type.
    ///
    /// Errors: missing tensor, wrong rank or shape ([`Error::Model`]), unsupported type
    /// ([`Error::Unsupported`]) — each naming the file and tensor.
    pub fn load(
        gguf: &GgufFile,
        name: &str,
        rows: Option<usize>,
        cols: Option<usize>,
    ) -> Result<Weight> {
        let info = gguf.tensor(name)?.clone();
        let bad = |what: String| Error::Model {
            path: gguf.path().to_path_buf(),
            what,
        };
        if info.dims.len() != 2 {
            return Err(bad(format!(
                "tensor {name} has {} dims, expected 2",
                info.dims.len()
            )));
        }
        let (c, r) = (info.dims[0] as usize, info.dims[1] as usize);
        if rows.is_some_and(|x| x != r) || cols.is_some_and(|x| x != c) {
            return Err(bad(format!(
                "tensor {name} has shape [{r}, {c}] (rows, cols), expected [{}, {}]",
                rows.map_or("any".into(), |x| x.to_string()),
                cols.map_or("any".into(), |x| x.to_string()),
            )));
        }
        if !quant::supports(info.ggml_type) {
            return Err(Error::Unsupported(format!(
                "{}: tensor {name} has type {}, which this engine has no kernels for yet",
                gguf.path().display(),
                info.ggml_type
            )));
        }
        Ok(Weight {
            info,
            rows: r,
            cols: c,
            repacked: Default::default(),
        })
    }

    /// A matrix view over the mapped bytes (and the place of its repacked copy, if it gets one).
    pub fn matrix<'a>(&'a self, gguf: &'a GgufFile) -> QMatrix<'a> {
        QMatrix {
            ty: self.info.ggml_type,
            rows: self.rows,
            cols: self.cols,
            data: gguf.tensor_data(&self.info),
            repacked: matches!(
                self.info.ggml_type,
                quant::GgmlType::Q4_0 | quant::GgmlType::IQ4_NL
            )
            .then_some(&*self.repacked),
        }
    }

    /// Bytes of the repacked copy made so far (0 before the first product that uses one).
    pub fn repacked_bytes(&self) -> usize {
        self.repacked.get().map_or(0, Vec::len)
    }
}

/// Read a 1-D tensor (norm weights, biases) of `len` elements as f32. These are small (one row) and copied
/// at load, before any session's `--simd` setting is known, so with the portable dequantizers
/// ([`crate::Simd::Off`]: what `off` checks, and the same values every setting gives); the matrices stay
/// in the map.
///
/// Errors: missing tensor, wrong element count, unsupported type — naming the file and tensor.
pub fn load_vector(gguf: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let info = gguf.tensor(name)?;
    if info.n_elements != len as u64 {
        return Err(Error::Model {
            path: gguf.path().to_path_buf(),
            what: format!(
                "tensor {name} has {} elements, expected {len}",
                info.n_elements
            ),
        });
    }
    let mut out = vec![0.0; len];
    quant::dequantize_row_with(
        info.ggml_type,
        gguf.tensor_data(info),
        &mut out,
        crate::Simd::Off,
    )?;
    Ok(out)
}
