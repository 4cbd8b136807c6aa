//! A streaming GGUF writer laid out byte for byte as llama-quantize writes its output.
//!
//! llama-quantize (`llama_model_quantize_impl`, src/llama-quant.cpp) builds a `gguf_context`, writes
//! `gguf_get_meta_size` zero bytes, streams each tensor's data followed by zeros up to a multiple of
//! `GGUF_DEFAULT_ALIGNMENT` (32), and finally seeks back to write `gguf_get_meta_data` over the zeros. The
//! metadata blob (`gguf_write_out` with `only_meta`, ggml/src/gguf.cpp) is: magic `GGUF`, version 3 (u32),
//! tensor count and key/value count (i64), every key/value in context order, every tensor info (name,
//! `n_dims = ggml_n_dims` as u32, `ne[0..n_dims]` as i64, type as i32, offset as u64), zero padding to 32.
//! A tensor's offset is the previous one's plus its byte size rounded up to 32 (`gguf_add_tensor`,
//! `gguf_set_tensor_type`). Since every size is known before the first byte is written, this writer emits
//! the metadata first and then streams the tensors: the same bytes, written front to back.

use std::io::{self, Write};

use super::choice::n_dims;
use crate::quant::GgmlType;

/// `GGUF_DEFAULT_ALIGNMENT` (gguf.h): llama-quantize pads data to this, whatever the input's alignment.
pub const ALIGNMENT: u64 = 32;

/// `GGUF_VERSION` (gguf.h): the version `gguf_init_empty` gives the output.
pub const VERSION: u32 = 3;

/// One tensor of the output: name, shape (ggml `ne` order), type and data size in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Tensor name.
    pub name: String,
    /// Shape in ggml `ne` order (`dims[0]` the row length); trailing 1s are not written (`ggml_n_dims`).
    pub dims: Vec<u64>,
    /// Output type.
    pub ty: GgmlType,
    /// Data bytes (`ggml_nbytes`), before padding.
    pub n_bytes: u64,
}

/// The complete layout of an output file: metadata blob and the offset of each tensor.
#[derive(Clone, Debug)]
pub struct Layout {
    header: Vec<u8>,
    tensors: Vec<TensorSpec>,
    offsets: Vec<u64>,
}

/// `GGML_PAD(x, 32)`.
pub fn pad(x: u64) -> u64 {
    x.div_ceil(ALIGNMENT) * ALIGNMENT
}

impl Layout {
    /// Lays out a file from already encoded metadata entries (each: key, type id, value, as in the file;
    /// see `gguf::encode_entry` and `GgufFile::metadata_raw`), in order, and the tensors, in order.
    pub fn new(entries: &[Vec<u8>], tensors: Vec<TensorSpec>) -> Layout {
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&(tensors.len() as i64).to_le_bytes());
        h.extend_from_slice(&(entries.len() as i64).to_le_bytes());
        for e in entries {
            h.extend_from_slice(e);
        }
        let mut offsets = Vec::with_capacity(tensors.len());
        let mut off = 0u64;
        for t in &tensors {
            offsets.push(off);
            h.extend_from_slice(&(t.name.len() as u64).to_le_bytes());
            h.extend_from_slice(t.name.as_bytes());
            let nd = n_dims(&t.dims);
            h.extend_from_slice(&(nd as u32).to_le_bytes());
            for j in 0..nd {
                let d = t.dims.get(j).copied().unwrap_or(1);
                h.extend_from_slice(&(d as i64).to_le_bytes());
            }
            h.extend_from_slice(&(t.ty.id() as i32).to_le_bytes());
            h.extend_from_slice(&off.to_le_bytes());
            off += pad(t.n_bytes);
        }
        h.resize(pad(h.len() as u64) as usize, 0);
        Layout {
            header: h,
            tensors,
            offsets,
        }
    }

    /// The metadata blob: header, key/values, tensor infos, padding (`gguf_get_meta_data`).
    pub fn header(&self) -> &[u8] {
        &self.header
    }

    /// The tensors, in file order.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Offset of tensor `i`'s data relative to the end of the header.
    pub fn offset(&self, i: usize) -> u64 {
        self.offsets[i]
    }

    /// Size of the whole file in bytes.
    pub fn file_size(&self) -> u64 {
        self.header.len() as u64 + self.tensors.iter().map(|t| pad(t.n_bytes)).sum::<u64>()
    }
}

/// Writes a [`Layout`] front to back: [`StreamWriter::new`] writes the header, each
/// [`StreamWriter::write_tensor`] one tensor's data and padding, in layout order.
pub struct StreamWriter<'a, W: Write> {
    out: W,
    layout: &'a Layout,
    next: usize,
}

impl<'a, W: Write> StreamWriter<'a, W> {
    /// Writes the header of `layout` to `out`.
    ///
    /// Errors: the I/O error of `out`.
    pub fn new(mut out: W, layout: &'a Layout) -> io::Result<Self> {
        out.write_all(&layout.header)?;
        Ok(StreamWriter {
            out,
            layout,
            next: 0,
        })
    }

    /// Writes the data of the next tensor (`data.len()` must be its `n_bytes`) and the zero padding to 32.
    ///
    /// Errors: [`io::ErrorKind::InvalidInput`] when all tensors are written or `data` has the wrong size
    /// (naming the tensor); the I/O error of `out`.
    pub fn write_tensor(&mut self, data: &[u8]) -> io::Result<()> {
        let Some(t) = self.layout.tensors.get(self.next) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "more tensor data than the layout has tensors",
            ));
        };
        if data.len() as u64 != t.n_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "tensor '{}' ({}) takes {} bytes, got {}",
                    t.name,
                    t.ty,
                    t.n_bytes,
                    data.len()
                ),
            ));
        }
        self.out.write_all(data)?;
        let padding = (pad(t.n_bytes) - t.n_bytes) as usize;
        self.out.write_all(&[0u8; ALIGNMENT as usize][..padding])?;
        self.next += 1;
        Ok(())
    }

    /// Checks that every tensor was written, flushes and returns the output.
    ///
    /// Errors: [`io::ErrorKind::InvalidInput`] naming the first tensor not written; the flush error.
    pub fn finish(mut self) -> io::Result<W> {
        if let Some(t) = self.layout.tensors.get(self.next) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("tensor '{}' was never written", t.name),
            ));
        }
        self.out.flush()?;
        Ok(self.out)
    }
}
