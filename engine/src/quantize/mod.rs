//! Model quantization, byte-identical to `llama-quantize` of the pinned llama.cpp (0c1e570).
//!
//! [`plan`] decides the output of `llama_model_quantize_impl` (src/llama-quant.cpp) for a source file:
//!
//! - **Metadata**: every key/value of the source in its order (`gguf_set_kv`; each entry copied as encoded,
//!   bools written 0/1), except `general.quantization_version` and `general.file_type`, which
//!   `gguf_set_val_u32` removes and appends at the end (2 = `GGML_QNT_VERSION`, then the `llama_ftype`),
//!   and the split keys `split.no`, `split.count`, `split.tensors.count` (`gguf_remove_key`).
//! - **Tensor order**: `llama_model_loader::weights_map`, a `std::map` ordered by [`choice::weight_order`]
//!   (layer number of `blk.N.`, non-layer tensors first, then name).
//! - **Types**: [`choice::tensor_type`] (`llama_tensor_get_type` with `--pure`, or a non-block file type).
//! - **Layout**: [`writer::Layout`] (version 3, alignment 32, offsets packed in order).
//!
//! [`write`] then streams the file: a tensor whose type does not change is copied; one that does is
//! dequantized to f32 ([`rows::dequantize_rows`]) and quantized ([`rows::quantize_rows`]), one tensor in
//! memory at a time.
//!
//! [`QuantizeParams::variant`] is lockstep's variant recipe (`oracles/llamacpp/make_variants.sh`):
//! `llama-quantize --allow-requantize SRC F32.gguf F32`, then `llama-quantize --pure F32.gguf OUT TYPE`,
//! done in one pass: every quantizable tensor goes through f32 (exact dequantization) and is quantized to
//! its type even when the source already has that type, which is what the two steps do; the metadata and
//! order of the two steps equal those of one.

pub mod choice;
pub mod ftype;
pub mod rows;
pub mod writer;

#[cfg(test)]
mod tests;

use std::io::Write;
use std::path::PathBuf;

pub use ftype::FileType;

use crate::error::{Error, Result};
use crate::gguf::{encode_entry, GgufFile, MetaValue, TensorInfo};
use crate::quant::GgmlType;
use writer::{Layout, StreamWriter, TensorSpec};

/// `GGML_QNT_VERSION` (ggml.h), written as `general.quantization_version`.
pub const QNT_VERSION: u32 = 2;

/// The keys llama-quantize sets at the end of the metadata, in this order.
const KEY_QNT_VERSION: &str = "general.quantization_version";
const KEY_FILE_TYPE: &str = "general.file_type";
/// The keys llama-quantize removes (`LLM_KV_SPLIT_*`).
const SPLIT_KEYS: [&str; 3] = ["split.no", "split.count", "split.tensors.count"];

/// What to make, as llama-quantize's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantizeParams {
    /// Output file type (`general.file_type` and the default tensor type).
    pub ftype: FileType,
    /// `--pure`: every quantizable tensor gets the default type (then the shape fallback). Without it a
    /// block file type needs llama.cpp's type mixture, which is not implemented (an error).
    pub pure: bool,
    /// `--allow-requantize`: a tensor of a block type may be converted to another type.
    pub allow_requantize: bool,
    /// Go through an exact F32 file first (`llama-quantize --allow-requantize SRC F32` then this), in one
    /// pass: every quantizable tensor is dequantized and quantized again even when its type stays.
    pub via_f32: bool,
}

impl QuantizeParams {
    /// lockstep's variant recipe for `ftype`: F32 dequantization, then `--pure` (see the module docs).
    pub fn variant(ftype: FileType) -> QuantizeParams {
        QuantizeParams {
            ftype,
            pure: true,
            allow_requantize: true,
            via_f32: true,
        }
    }
}

/// One tensor of the output and where it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorPlan {
    /// Index of the tensor in the source file's [`GgufFile::tensors`].
    pub src_index: usize,
    /// Tensor name.
    pub name: String,
    /// Shape, ggml `ne` order.
    pub dims: Vec<u64>,
    /// Type in the source file.
    pub src_type: GgmlType,
    /// Type in the output.
    pub dst_type: GgmlType,
    /// Whether the shape fallback changed the type (llama.cpp's `n_fallback`).
    pub fell_back: bool,
    /// Whether the data is converted (dequantized and quantized) rather than copied.
    pub convert: bool,
}

/// The complete output of one quantization: the layout and each tensor's plan, in file order.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The file's bytes before tensor data, and tensor offsets.
    pub layout: Layout,
    /// The tensors, in file order.
    pub tensors: Vec<TensorPlan>,
}

impl Plan {
    /// Size of the output file in bytes.
    pub fn file_size(&self) -> u64 {
        self.layout.file_size()
    }

    /// Tensors per output type, in order of first appearance: `[(Q4_0, 181), (Q2_K, 30), (F32, 61)]`.
    pub fn type_counts(&self) -> Vec<(GgmlType, usize)> {
        let mut out: Vec<(GgmlType, usize)> = Vec::new();
        for t in &self.tensors {
            match out.iter_mut().find(|(ty, _)| *ty == t.dst_type) {
                Some(e) => e.1 += 1,
                None => out.push((t.dst_type, 1)),
            }
        }
        out
    }
}

fn model_err(src: &GgufFile, what: String) -> Error {
    Error::Model {
        path: src.path().to_path_buf(),
        what,
    }
}

/// Decides the output file of quantizing `src` with `params` (see the module docs) without converting
/// anything.
///
/// Errors (naming the source file): no `general.architecture`; a `general.alignment` other than 32
/// (llama-quantize would copy the key but pad to 32, a broken file); nested metadata arrays (gguf cannot
/// read them); a type choice error ([`choice::tensor_type`]); a tensor that would need requantizing
/// without `allow_requantize` ("requantizing from type … is disabled", as llama-quantize); a target type
/// without a quantizer or a source type without a dequantizer (the type named).
pub fn plan(src: &GgufFile, params: &QuantizeParams) -> Result<Plan> {
    let arch = src
        .get("general.architecture")
        .and_then(MetaValue::as_str)
        .ok_or_else(|| {
            model_err(
                src,
                "no string general.architecture: llama-quantize cannot load it".into(),
            )
        })?
        .to_string();

    let mut entries = Vec::with_capacity(src.metadata().len() + 2);
    for (i, (key, value)) in src.metadata().iter().enumerate() {
        if key == KEY_QNT_VERSION || key == KEY_FILE_TYPE || SPLIT_KEYS.contains(&key.as_str()) {
            continue;
        }
        if key == "general.alignment" && *value != MetaValue::U32(writer::ALIGNMENT as u32) {
            return Err(model_err(
                src,
                format!(
                    "general.alignment is {value:?}: llama-quantize writes with alignment {} and copies \
                     the key unchanged, which makes an inconsistent file; not reproduced",
                    writer::ALIGNMENT
                ),
            ));
        }
        let items = value.as_array().unwrap_or(&[]);
        if items.iter().any(|e| e.as_array().is_some()) {
            return Err(model_err(
                src,
                format!(
                    "metadata key '{key}' holds nested arrays, which llama.cpp's gguf cannot read"
                ),
            ));
        }
        let is_bool = matches!(value, MetaValue::Bool(_))
            || items
                .first()
                .is_some_and(|e| matches!(e, MetaValue::Bool(_)));
        if is_bool {
            entries.push(encode_entry(key, value));
        } else {
            match src.metadata_raw(i) {
                Some(raw) => entries.push(raw.to_vec()),
                // a Hugging Face directory has no GGUF bytes: its keys are encoded here
                None if src.hf_source().is_some() => entries.push(encode_entry(key, value)),
                None => return Err(model_err(src, format!("metadata entry {i} has no bytes"))),
            }
        }
    }
    entries.push(encode_entry(KEY_QNT_VERSION, &MetaValue::U32(QNT_VERSION)));
    entries.push(encode_entry(
        KEY_FILE_TYPE,
        &MetaValue::U32(params.ftype.llama_ftype()),
    ));

    let mut order: Vec<usize> = (0..src.tensors().len()).collect();
    order.sort_by(|&a, &b| choice::weight_order(&src.tensors()[a].name, &src.tensors()[b].name));

    let default_type = params.ftype.default_type();
    let mut tensors = Vec::with_capacity(order.len());
    let mut specs = Vec::with_capacity(order.len());
    for i in order {
        let t: &TensorInfo = &src.tensors()[i];
        let (dst_type, fell_back) = choice::tensor_type(
            &t.name,
            &t.dims,
            &arch,
            t.ggml_type,
            default_type,
            params.pure,
        )
        .map_err(|e| model_err(src, format!("tensor '{}': {e}", t.name)))?;
        let allowed = choice::allows_quantization(&t.name, &t.dims, &arch);
        let convert = if params.via_f32 {
            allowed
        } else {
            dst_type != t.ggml_type
        };
        if convert {
            if !params.via_f32 && choice::is_quantized(t.ggml_type) && !params.allow_requantize {
                return Err(model_err(
                    src,
                    format!(
                        "tensor '{}': requantizing from type {} is disabled (allow_requantize)",
                        t.name, t.ggml_type
                    ),
                ));
            }
            rows::check_quantizer(dst_type)
                .map_err(|e| model_err(src, format!("tensor '{}': {e}", t.name)))?;
            if !crate::quant::supports(t.ggml_type) {
                return Err(model_err(
                    src,
                    format!(
                        "tensor '{}': cannot dequantize/convert tensor type {}",
                        t.name, t.ggml_type
                    ),
                ));
            }
        }
        let n_bytes = dst_type.bytes_for(t.n_elements).ok_or_else(|| {
            model_err(
                src,
                format!(
                    "tensor '{}': {} elements are not a whole number of {dst_type} blocks",
                    t.name, t.n_elements
                ),
            )
        })?;
        specs.push(TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: dst_type,
            n_bytes: n_bytes as u64,
        });
        tensors.push(TensorPlan {
            src_index: i,
            name: t.name.clone(),
            dims: t.dims.clone(),
            src_type: t.ggml_type,
            dst_type,
            fell_back,
            convert,
        });
    }
    Ok(Plan {
        layout: Layout::new(&entries, specs),
        tensors,
    })
}

/// Writes the file `plan` describes, from `src`, to `out` (streamed: one tensor's f32 values and output
/// bytes in memory at a time). `out_name` names the output in errors. Call `plan` with the same `src`.
///
/// Errors: [`Error::Io`] naming `out_name` for a write error; a conversion error naming the tensor.
pub fn write<W: Write>(
    src: &GgufFile,
    plan: &Plan,
    out: W,
    out_name: &std::path::Path,
) -> Result<W> {
    let io = |source| Error::Io {
        path: PathBuf::from(out_name),
        source,
    };
    let mut w = StreamWriter::new(out, &plan.layout).map_err(io)?;
    for (k, t) in plan.tensors.iter().enumerate() {
        let info = &src.tensors()[t.src_index];
        let data = src.tensor_data(info);
        if !t.convert {
            w.write_tensor(data).map_err(io)?;
            continue;
        }
        let n_per_row = info.row_len() as usize;
        let mut f32s = vec![0f32; info.n_elements as usize];
        rows::dequantize_rows(t.src_type, data, n_per_row, &mut f32s)
            .map_err(|e| model_err(src, format!("tensor '{}': {e}", t.name)))?;
        let n_bytes = plan.layout.tensors()[k].n_bytes as usize;
        let mut out = vec![0u8; n_bytes];
        rows::quantize_rows(t.dst_type, &f32s, n_per_row, &mut out)
            .map_err(|e| model_err(src, format!("tensor '{}': {e}", t.name)))?;
        drop(f32s);
        w.write_tensor(&out).map_err(io)?;
    }
    w.finish().map_err(io)
}

/// [`plan`] then [`write`]: quantizes `src` with `params` into `out`, returning the plan.
pub fn quantize<W: Write>(
    src: &GgufFile,
    params: &QuantizeParams,
    out: W,
    out_name: &std::path::Path,
) -> Result<(Plan, W)> {
    let p = plan(src, params)?;
    let w = write(src, &p, out, out_name)?;
    Ok((p, w))
}
