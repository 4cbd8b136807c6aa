//! The GGUF v2/v3 parser: header, metadata, tensor-info table, data-section layout.
//!
//! Every read goes through [`Cursor`], which checks the bytes that remain before touching them, and every
//! count read from the file is checked against the bytes that remain before anything is allocated from
//! it. Layout follows the GGUF spec (ggml/docs/gguf.md); the checks mirror and in places tighten those of
//! llama.cpp's `gguf_init_from_reader` (ggml/src/gguf.cpp).

use std::collections::HashMap;
use std::path::Path;

use super::value::{type_id, type_name_of_id, MetaValue};
use super::TensorInfo;
use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// `"GGUF"` as it appears in the first four bytes of the file.
pub(crate) const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section and of every tensor when `general.alignment` is absent (GGUF spec,
/// `GGUF_DEFAULT_ALIGNMENT`).
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that overrides [`DEFAULT_ALIGNMENT`]; must be a u32 (gguf.cpp).
pub(crate) const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml tensors have at most four dimensions (`GGML_MAX_DIMS`).
pub(crate) const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays accepted (an array of arrays is depth 2). The spec sets no limit; this bound
/// keeps recursion shallow on hostile input. Real files use depth 1.
pub(crate) const MAX_ARRAY_DEPTH: u32 = 8;
/// Most array elements (summed over all metadata, at every nesting level) one file may hold. Each
/// element costs `size_of::<MetaValue>()` (32 bytes) in memory while it may take one byte in the file;
/// this caps that amplification at 512 MiB. The largest real metadata (a 262k-token vocabulary with
/// scores, types and merges) is about 1.5 M elements.
pub(crate) const MAX_METADATA_ELEMENTS: u64 = 1 << 24;

/// Smallest possible key/value record: key length (8) + a 1-byte key + value type (4) + a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest possible tensor-info record: name length (8) + a 1-byte name + n_dims (4) + one dim (8) +
/// type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 1 + 4 + 8 + 4 + 8;

/// Everything the parser learns from a file.
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub metadata: Vec<(String, MetaValue)>,
    /// Byte range of each metadata entry in the file (key, type id and value), in `metadata` order.
    pub metadata_spans: Vec<std::ops::Range<usize>>,
    pub meta_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
}

/// Parse a whole GGUF file held in `buf`; `path` names it in errors.
pub(crate) fn parse(buf: &[u8], path: &Path) -> Result<Parsed> {
    let mut c = Cursor {
        buf,
        pos: 0,
        path,
        element_budget: MAX_METADATA_ELEMENTS,
    };

    // --- Header: magic, version, tensor count, metadata count.
    if buf.len() < 4 {
        return Err(c.err(
            0,
            format!(
                "file is {} bytes long, too short to hold the 4-byte GGUF magic; this is not a GGUF file",
                buf.len()
            ),
        ));
    }
    let magic = c.take(4, &|| "magic".to_string())?;
    if magic != MAGIC {
        return Err(c.err(
            0,
            format!(
                "bad magic {}: expected \"GGUF\" (47 47 55 46); this is not a GGUF file",
                show_magic(magic)
            ),
        ));
    }
    let version = c.u32(&|| "version".to_string())?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(c.err(
                4,
                "GGUF version 1 is not supported (v1 used 32-bit counts and lengths and was retired in \
                 2023); convert the model again with a current llama.cpp or gguf-py",
            ))
        }
        v if v != 0 && v & 0xFFFF == 0 => {
            return Err(c.err(
                4,
                format!(
                    "version field reads {v:#010x}: this looks like a big-endian GGUF file, which is \
                     not supported (only little-endian versions 2 and 3 are)"
                ),
            ))
        }
        v => {
            return Err(c.err(
                4,
                format!("unsupported GGUF version {v} (this reader supports versions 2 and 3)"),
            ))
        }
    }
    let n_tensors = c.u64(&|| "tensor count".to_string())?;
    let n_kv = c.u64(&|| "metadata key/value count".to_string())?;
    let rem = c.remaining() as u64;
    if n_kv > rem / MIN_KV_BYTES {
        return Err(c.err(
            16,
            format!(
                "metadata count {n_kv} is impossible: each key/value pair takes at least {MIN_KV_BYTES} \
                 bytes and only {rem} bytes follow the header"
            ),
        ));
    }
    if n_tensors > rem / MIN_TENSOR_INFO_BYTES {
        return Err(c.err(
            8,
            format!(
                "tensor count {n_tensors} is impossible: each tensor-info record takes at least \
                 {MIN_TENSOR_INFO_BYTES} bytes and only {rem} bytes follow the header"
            ),
        ));
    }

    // --- Metadata key/value pairs. Both counts are now bounded by the file size, so the
    // `with_capacity` calls below cannot be driven by a hostile number.
    let mut metadata: Vec<(String, MetaValue)> = Vec::with_capacity(n_kv as usize);
    let mut value_offsets: Vec<usize> = Vec::with_capacity(n_kv as usize);
    let mut metadata_spans: Vec<std::ops::Range<usize>> = Vec::with_capacity(n_kv as usize);
    let mut meta_index: HashMap<String, usize> = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key_off = c.pos;
        let key = c.string(&|| format!("key of metadata entry {i}"))?;
        if key.is_empty() {
            return Err(c.err(key_off, format!("metadata entry {i} has an empty key")));
        }
        if let Some(&j) = meta_index.get(&key) {
            return Err(c.err(
                key_off,
                format!("duplicate metadata key '{key}' (entries {j} and {i})"),
            ));
        }
        let type_off = c.pos;
        let ty = c.u32(&|| format!("value type of metadata key '{key}'"))?;
        let value_off = c.pos;
        let value = c.value(ty, type_off, 0, &|| format!("metadata key '{key}'"))?;
        meta_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
        value_offsets.push(value_off);
        metadata_spans.push(key_off..c.pos);
    }

    // --- Alignment (gguf.cpp: must be a u32, nonzero, a power of two).
    let alignment = match meta_index.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => {
            let at = value_offsets[i];
            match metadata[i].1 {
                MetaValue::U32(a) if a != 0 && a.is_power_of_two() => u64::from(a),
                MetaValue::U32(a) => {
                    return Err(c.err(
                        at,
                        format!("{ALIGNMENT_KEY} is {a}: it must be a nonzero power of two"),
                    ))
                }
                ref other => {
                    return Err(c.err(
                        at,
                        format!(
                            "{ALIGNMENT_KEY} must be a u32 (as llama.cpp requires) but is a {}",
                            other.describe()
                        ),
                    ))
                }
            }
        }
    };

    // --- Tensor-info table.
    let rem = c.remaining() as u64;
    if n_tensors > rem / MIN_TENSOR_INFO_BYTES {
        return Err(c.err(
            8,
            format!(
                "tensor count {n_tensors} is impossible: each tensor-info record takes at least \
                 {MIN_TENSOR_INFO_BYTES} bytes and only {rem} bytes follow the metadata"
            ),
        ));
    }
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
    let mut offset_field: Vec<usize> = Vec::with_capacity(n_tensors as usize);
    let mut tensor_index: HashMap<String, usize> = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name_off = c.pos;
        let name = c.string(&|| format!("name of tensor {i}"))?;
        if name.is_empty() {
            return Err(c.err(name_off, format!("tensor {i} has an empty name")));
        }
        if let Some(&j) = tensor_index.get(&name) {
            return Err(c.err(
                name_off,
                format!("duplicate tensor name '{name}' (tensors {j} and {i})"),
            ));
        }
        let ndims_off = c.pos;
        let n_dims = c.u32(&|| format!("dimension count of tensor '{name}'"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(c.err(
                ndims_off,
                format!(
                    "tensor '{name}' has {n_dims} dimensions; ggml tensors have 1 to {MAX_DIMS}"
                ),
            ));
        }
        let dims_off = c.pos;
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            let dim_off = c.pos;
            let dim = c.u64(&|| format!("dimension {d} of tensor '{name}'"))?;
            if dim == 0 {
                return Err(c.err(
                    dim_off,
                    format!(
                        "tensor '{name}' dimension {d} is 0; every dimension must be at least 1"
                    ),
                ));
            }
            dims.push(dim);
        }
        // ggml counts elements in int64_t, so the product must also fit i64 (gguf.cpp checks the same).
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| {
                c.err(
                    dims_off,
                    format!("tensor '{name}' shape {dims:?} has more than 2^63-1 elements"),
                )
            })?;
        let type_off = c.pos;
        let type_raw = c.u32(&|| format!("ggml type of tensor '{name}'"))?;
        let ggml_type = GgmlType::from_id(type_raw).ok_or_else(|| {
            c.err(
                type_off,
                format!("tensor '{name}' has unknown ggml type id {type_raw}"),
            )
        })?;
        let block = ggml_type.block_size() as u64;
        if dims[0] % block != 0 {
            return Err(c.err(
                dims_off,
                format!(
                    "tensor '{name}' of type {ggml_type} has rows of {} elements, not a multiple of the \
                     {ggml_type} block size {block}",
                    dims[0]
                ),
            ));
        }
        let n_bytes = ggml_type.bytes_for(n_elements).ok_or_else(|| {
            c.err(
                dims_off,
                format!(
                    "tensor '{name}' shape {dims:?} of type {ggml_type} has a byte size that does not \
                     fit in memory"
                ),
            )
        })?;
        let off_off = c.pos;
        let relative = c.u64(&|| format!("data offset of tensor '{name}'"))?;
        tensor_index.insert(name.clone(), tensors.len());
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            // Relative for now; made absolute once the data section start is known.
            offset: relative,
            n_elements,
            n_bytes,
        });
        offset_field.push(off_off);
    }

    // --- Data section: starts at the next multiple of the alignment (GGUF spec; gguf-py's reader).
    let file_len = buf.len() as u64;
    let header_end = c.pos as u64;
    let data_offset = align_up(header_end, alignment).ok_or_else(|| {
        c.err(
            c.pos,
            "data section start overflows a 64-bit offset".to_string(),
        )
    })?;
    if !tensors.is_empty() && data_offset > file_len {
        return Err(c.err(
            c.pos,
            format!(
                "tensor data section would start at offset {data_offset} (the end of the tensor-info \
                 table, {header_end}, padded to the alignment {alignment}) but the file is only \
                 {file_len} bytes"
            ),
        ));
    }
    for (t, &field) in tensors.iter_mut().zip(&offset_field) {
        let relative = t.offset;
        if relative % alignment != 0 {
            return Err(c.err(
                field,
                format!(
                    "tensor '{}' data offset {relative} (relative to the data section at {data_offset}) \
                     is not a multiple of the alignment {alignment}",
                    t.name
                ),
            ));
        }
        let absolute = data_offset.checked_add(relative);
        let end = absolute.and_then(|a| a.checked_add(t.n_bytes as u64));
        match (absolute, end) {
            (Some(a), Some(e)) if e <= file_len => t.offset = a,
            _ => {
                return Err(c.err(
                    field,
                    format!(
                        "tensor '{}' data [offset {}, {} bytes] extends past end of file (size \
                         {file_len})",
                        t.name,
                        u128::from(data_offset) + u128::from(relative),
                        t.n_bytes
                    ),
                ))
            }
        }
    }

    // --- No two tensors may share bytes (llama.cpp requires them packed in order; this is looser and
    // accepts any order, but an overlap always means a corrupt table).
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.offset + a.n_bytes as u64 > b.offset {
            return Err(c.err(
                offset_field[w[1]],
                format!(
                    "tensor '{}' data [offset {}, {} bytes] overlaps tensor '{}' data [offset {}, {} \
                     bytes]",
                    b.name, b.offset, b.n_bytes, a.name, a.offset, a.n_bytes
                ),
            ));
        }
    }

    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        metadata_spans,
        meta_index,
        tensors,
        tensor_index,
    })
}

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    let mask = align.checked_sub(1)?;
    Some(x.checked_add(mask)? & !mask)
}

/// The four magic bytes for a message: as text if printable, else as hex.
fn show_magic(m: &[u8]) -> String {
    if m.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("\"{}\"", String::from_utf8_lossy(m))
    } else {
        let hex: Vec<String> = m.iter().map(|b| format!("{b:02x}")).collect();
        format!("({})", hex.join(" "))
    }
}

/// Smallest number of bytes one element of GGUF value type `id` can take, or `None` for an id the
/// spec does not define. A string takes at least its 8-byte length; a nested array at least its
/// element type (4) and count (8).
fn min_value_bytes(id: u32) -> Option<u64> {
    Some(match id {
        type_id::U8 | type_id::I8 | type_id::BOOL => 1,
        type_id::U16 | type_id::I16 => 2,
        type_id::U32 | type_id::I32 | type_id::F32 => 4,
        type_id::U64 | type_id::I64 | type_id::F64 => 8,
        type_id::STRING => 8,
        type_id::ARRAY => 12,
        _ => return None,
    })
}

/// A bounds-checked little-endian reader over the file bytes. Invariant: `pos <= buf.len()`.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// Array elements still allowed before [`MAX_METADATA_ELEMENTS`] is reached.
    element_budget: u64,
}

/// Lazily built description of the field being read, used only when an error is reported.
type What<'w> = &'w dyn Fn() -> String;

impl<'a> Cursor<'a> {
    fn err(&self, offset: usize, what: impl Into<String>) -> Error {
        Error::Gguf {
            path: self.path.to_path_buf(),
            offset: offset as u64,
            what: what.into(),
        }
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes, or an end-of-file error naming the field.
    fn take(&mut self, n: usize, what: What<'_>) -> Result<&'a [u8]> {
        let rem = self.remaining();
        if n > rem {
            return Err(self.err(
                self.pos,
                format!(
                    "unexpected end of file reading {}: it needs {n} bytes but only {rem} remain (file \
                     size {})",
                    what(),
                    self.buf.len()
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: What<'_>) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u8(&mut self, what: What<'_>) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: What<'_>) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: What<'_>) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: What<'_>) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF string: u64 byte length, then that many bytes of UTF-8.
    fn string(&mut self, what: What<'_>) -> Result<String> {
        let start = self.pos;
        let len = self.u64(&|| format!("the length of {}", what()))?;
        let rem = self.remaining();
        if len > rem as u64 {
            return Err(self.err(
                start,
                format!(
                    "{} has length {len} but only {rem} bytes remain in the file (size {})",
                    what(),
                    self.buf.len()
                ),
            ));
        }
        let bytes = self.take(len as usize, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.err(
                start,
                format!(
                    "{} is not valid UTF-8 (bad byte at offset {})",
                    what(),
                    start + 8 + e.valid_up_to()
                ),
            )),
        }
    }

    /// One value of GGUF type `ty`; `type_off` is where that type id was read (for the error on an
    /// unknown id); `depth` is the array nesting level of the value being read.
    fn value(&mut self, ty: u32, type_off: usize, depth: u32, what: What<'_>) -> Result<MetaValue> {
        Ok(match ty {
            type_id::U8 => MetaValue::U8(self.u8(what)?),
            type_id::I8 => MetaValue::I8(self.u8(what)? as i8),
            type_id::U16 => MetaValue::U16(self.u16(what)?),
            type_id::I16 => MetaValue::I16(self.u16(what)? as i16),
            type_id::U32 => MetaValue::U32(self.u32(what)?),
            type_id::I32 => MetaValue::I32(self.u32(what)? as i32),
            type_id::F32 => MetaValue::F32(f32::from_bits(self.u32(what)?)),
            type_id::BOOL => MetaValue::Bool(self.u8(what)? != 0),
            type_id::STRING => MetaValue::String(self.string(what)?),
            type_id::ARRAY => self.array_value(depth + 1, what)?,
            type_id::U64 => MetaValue::U64(self.u64(what)?),
            type_id::I64 => MetaValue::I64(self.u64(what)? as i64),
            type_id::F64 => MetaValue::F64(f64::from_bits(self.u64(what)?)),
            other => {
                return Err(self.err(
                    type_off,
                    format!(
                        "{} has unknown metadata value type {other} (GGUF defines types 0 to 12)",
                        what()
                    ),
                ))
            }
        })
    }

    /// An array value (after its `ARRAY` type id): element type, u64 count, elements.
    fn array_value(&mut self, depth: u32, what: What<'_>) -> Result<MetaValue> {
        let start = self.pos;
        if depth > MAX_ARRAY_DEPTH {
            return Err(self.err(
                start,
                format!(
                    "{} nests arrays more than {MAX_ARRAY_DEPTH} levels deep",
                    what()
                ),
            ));
        }
        let elem_type_off = self.pos;
        let elem_ty = self.u32(&|| format!("the element type of {}", what()))?;
        let min = min_value_bytes(elem_ty).ok_or_else(|| {
            self.err(
                elem_type_off,
                format!(
                    "{} is an array of unknown metadata value type {elem_ty} (GGUF defines types 0 \
                     to 12)",
                    what()
                ),
            )
        })?;
        let elem_name = type_name_of_id(elem_ty).unwrap_or("?");
        let count_off = self.pos;
        let n = self.u64(&|| format!("the element count of {}", what()))?;
        let rem = self.remaining() as u64;
        if n > rem / min {
            let need = match n.checked_mul(min) {
                Some(b) => format!("at least {b} bytes"),
                None => "more than 2^64 bytes".to_string(),
            };
            return Err(self.err(
                count_off,
                format!(
                    "{} claims {n} {elem_name} elements, which need {need}, but only {rem} bytes \
                     remain in the file",
                    what()
                ),
            ));
        }
        if n > self.element_budget {
            return Err(self.err(
                count_off,
                format!(
                    "{} claims {n} elements, which would take the file's metadata past \
                     {MAX_METADATA_ELEMENTS} array elements in total; refusing to load it",
                    what()
                ),
            ));
        }
        self.element_budget -= n;
        // `n <= rem / min <= buf.len()`, so this allocation is bounded by the file size.
        let mut items = Vec::with_capacity(n as usize);
        for i in 0..n {
            items.push(self.value(elem_ty, elem_type_off, depth, &|| {
                format!("element {i} of {}", what())
            })?);
        }
        Ok(MetaValue::Array(items))
    }
}
