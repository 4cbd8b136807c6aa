//! GGUF v2/v3 reader over a memory map, bounds-checked against hostile files, and an in-memory writer
//! for tests and synthetic fixtures.
//!
//! Format: the GGUF spec (ggml/docs/gguf.md in ggml-org/llama.cpp). A file is
//!
//! ```text
//! magic "GGUF" | version u32 (2 or 3) | tensor_count u64 | metadata_kv_count u64
//! metadata_kv_count × (key: string, value_type: u32, value)
//! tensor_count × (name: string, n_dims: u32, dims: u64 × n_dims, ggml_type: u32, offset: u64)
//! padding to `general.alignment` (default 32)
//! tensor data (each tensor at data_offset + offset, offset a multiple of the alignment)
//! ```
//!
//! with all numbers little-endian and every string a u64 byte length followed by UTF-8 bytes. Versions 2
//! and 3 share this layout (v3 only added big-endian files, which this reader refuses); version 1 used
//! 32-bit counts and is refused.
//!
//! Robustness: every count, length, dimension, offset and size read from the file is checked (with
//! overflow-checked arithmetic) against the bytes that remain before anything is allocated or indexed,
//! so a hostile header can neither panic the parser nor make it allocate more than a small multiple of
//! the file size. Every problem is an [`Error::Gguf`] naming the file, the byte offset of the bad field,
//! and what is wrong. The checks follow llama.cpp's `gguf_init_from_reader` (ggml/src/gguf.cpp) with
//! two differences: nested arrays are accepted (as in gguf-py), and tensors may appear in any order in
//! the data section as long as they are aligned, inside the file and do not overlap (llama.cpp requires
//! them packed in table order).
//!
//! Tensor data is never copied: [`GgufFile::tensor_data`] returns a slice of the mapped file.

mod parse;
mod value;
mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

pub use value::MetaValue;
pub(crate) use writer::encode_entry;
pub use writer::GgufWriter;

use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// One entry of the tensor-info table, validated against the file at parse time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`. Unique within the file, never empty.
    pub name: String,
    /// Shape in ggml `ne` order: `dims[0]` is the contiguous row length (a whole number of
    /// `ggml_type` blocks), `dims[1]` the number of rows, and so on. 1 to 4 entries, each ≥ 1.
    pub dims: Vec<u64>,
    /// Element type of the data.
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file (the data-section start plus the offset stored in
    /// the table); a multiple of the file's alignment.
    pub offset: u64,
    /// Number of elements: the product of `dims` (≤ `i64::MAX`, as ggml counts in `int64_t`).
    pub n_elements: u64,
    /// Bytes of data: `n_elements / block_size × type_size` for `ggml_type`.
    pub n_bytes: usize,
}

impl TensorInfo {
    /// Elements per row: `dims[0]`.
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(0)
    }

    /// Number of rows: the product of `dims[1..]` (1 for a vector).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Bytes per row: `row_len / block_size × type_size`.
    pub fn row_bytes(&self) -> usize {
        self.ggml_type.bytes_for(self.row_len()).unwrap_or(0)
    }
}

/// The tensors of one ggml type in a file ([`GgufFile::type_counts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeCount {
    /// The element type.
    pub ggml_type: GgmlType,
    /// Tensors of this type.
    pub tensors: usize,
    /// Their elements.
    pub elements: u64,
    /// Their data bytes.
    pub bytes: u64,
}

/// The bytes a [`GgufFile`] parses and lends out: a read-only memory map or an owned buffer, or (a model
/// presented from a Hugging Face directory, the `hf` module) several of them at virtual base offsets.
enum Backing {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
    Parts(Vec<Part>),
}

/// One piece of a [`Backing::Parts`]: bytes that [`TensorInfo::offset`]s from `base` to `base + len` address.
pub(crate) struct Part {
    /// Virtual offset of the first byte.
    pub base: u64,
    /// The bytes: a memory-mapped safetensors file, or a derived copy made at load.
    pub data: PartData,
}

/// The bytes of a [`Part`].
pub(crate) enum PartData {
    /// A read-only memory map (a `*.safetensors` file).
    Map(memmap2::Mmap),
    /// Bytes made at load (tensors whose layout differs between the two formats).
    Owned(Vec<u8>),
}

impl PartData {
    fn bytes(&self) -> &[u8] {
        match self {
            PartData::Map(m) => m,
            PartData::Owned(v) => v,
        }
    }
}

impl Backing {
    /// The whole GGUF file (empty for [`Backing::Parts`], which has no file image).
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
            Backing::Parts(_) => &[],
        }
    }

    /// `len` bytes at virtual offset `start`, `None` if they do not lie in one piece.
    fn range(&self, start: u64, len: usize) -> Option<&[u8]> {
        let (bytes, start) = match self {
            Backing::Parts(parts) => {
                let i = parts.partition_point(|p| p.base <= start).checked_sub(1)?;
                (parts[i].data.bytes(), start - parts[i].base)
            }
            b => (b.bytes(), start),
        };
        let start = usize::try_from(start).ok()?;
        bytes.get(start..start.checked_add(len)?)
    }
}

/// Where a [`GgufFile`]'s tensors come from when it presents a Hugging Face directory (the `hf` module).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HfSource {
    /// The `*.safetensors` files mapped, in the order their tensors were read.
    pub files: Vec<PathBuf>,
    /// Their total size in bytes.
    pub mapped_bytes: u64,
    /// Tensors that are a derived copy in memory (GGUF name, bytes, why), not bytes in place in a map.
    pub derived: Vec<(String, usize, String)>,
}

/// A parsed GGUF file that owns its bytes (a memory map or an in-memory buffer).
///
/// All header fields are parsed and validated when the file is opened; tensor data stays where it is
/// and is lent out as byte slices by [`GgufFile::tensor_data`].
pub struct GgufFile {
    backing: Backing,
    path: PathBuf,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    metadata_spans: Vec<std::ops::Range<usize>>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    hf: Option<HfSource>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("size", &self.file_size())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-map the file at `path` and parse it (a Hugging Face directory: the `hf` module's `open`).
    ///
    /// Errors: [`Error::Io`] naming `path` if it cannot be opened or mapped; [`Error::Gguf`] naming
    /// `path`, the byte offset and the problem if it is not a valid GGUF v2/v3 file.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let backing = if len == 0 {
            // Mapping zero bytes is an error on some platforms; an empty buffer parses to the same
            // "too short" error.
            Backing::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and private to this process. As with every memory-mapped
            // reader, another process truncating or rewriting the file while it is mapped is undefined
            // behaviour; model files are not modified while in use.
            Backing::Map(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Self::parse(backing, path.to_path_buf())
    }

    /// Parse a GGUF file held in memory; `label` stands in for the path in errors and in
    /// [`GgufFile::path`] (e.g. `"<memory>"` or a test name).
    ///
    /// Errors: [`Error::Gguf`] as for [`GgufFile::open`].
    pub fn from_bytes(bytes: Vec<u8>, label: &str) -> Result<GgufFile> {
        Self::parse(Backing::Owned(bytes), PathBuf::from(label))
    }

    fn parse(backing: Backing, path: PathBuf) -> Result<GgufFile> {
        let p = parse::parse(backing.bytes(), &path)?;
        Ok(GgufFile {
            backing,
            path,
            version: p.version,
            alignment: p.alignment,
            data_offset: p.data_offset,
            metadata: p.metadata,
            metadata_spans: p.metadata_spans,
            meta_index: p.meta_index,
            tensors: p.tensors,
            tensor_index: p.tensor_index,
            hf: None,
        })
    }

    /// A model held in pieces (a Hugging Face directory, the `hf` module's `open_dir`): metadata given as GGUF
    /// keys, tensors whose offsets address `parts` (sorted by base, non-overlapping). `path` is the directory.
    ///
    /// Errors: [`Error::Model`] naming `path` for a duplicate key or tensor name, or a tensor whose bytes do
    /// not lie inside one part.
    pub(crate) fn from_parts(
        path: PathBuf,
        metadata: Vec<(String, MetaValue)>,
        tensors: Vec<TensorInfo>,
        parts: Vec<Part>,
        hf: HfSource,
    ) -> Result<GgufFile> {
        let bad = |what: String| Error::Model {
            path: path.clone(),
            what,
        };
        let mut meta_index = HashMap::new();
        for (i, (k, _)) in metadata.iter().enumerate() {
            if meta_index.insert(k.clone(), i).is_some() {
                return Err(bad(format!("metadata key '{k}' twice")));
            }
        }
        let backing = Backing::Parts(parts);
        let mut tensor_index = HashMap::new();
        for (i, t) in tensors.iter().enumerate() {
            if tensor_index.insert(t.name.clone(), i).is_some() {
                return Err(bad(format!("tensor '{}' twice", t.name)));
            }
            if backing.range(t.offset, t.n_bytes).is_none() {
                return Err(bad(format!(
                    "tensor '{}': {} bytes at {} lie outside its file",
                    t.name, t.n_bytes, t.offset
                )));
            }
        }
        Ok(GgufFile {
            backing,
            path,
            version: 3,
            alignment: 1,
            data_offset: 0,
            metadata,
            metadata_spans: Vec::new(),
            meta_index,
            tensors,
            tensor_index,
            hf: Some(hf),
        })
    }

    /// `Some` when this model was read from a Hugging Face directory: the files mapped and the derived
    /// copies made (the `hf` module); `None` for a GGUF file.
    pub fn hf_source(&self) -> Option<&HfSource> {
        self.hf.as_ref()
    }

    /// The path the file was opened from, or the label given to [`GgufFile::from_bytes`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF format version: 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment in bytes of the data section and of each tensor's data: `general.alignment` if
    /// present (a u32 power of two), else 32 (GGUF spec `GGUF_DEFAULT_ALIGNMENT`).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset where the tensor data section starts: the end of the tensor-info table
    /// rounded up to [`GgufFile::alignment`] (as gguf-py's reader computes it). In a file with no
    /// tensors this may equal or exceed the file size.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the whole file in bytes (a Hugging Face directory: its `*.safetensors` files).
    pub fn file_size(&self) -> u64 {
        match &self.hf {
            Some(h) => h.mapped_bytes,
            None => self.backing.bytes().len() as u64,
        }
    }

    /// Every metadata key/value pair, in file order. Keys are unique and non-empty.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The encoded bytes of metadata entry `index` (in [`GgufFile::metadata`] order) exactly as they lie
    /// in the file: key (u64 length + bytes), value type id (u32), value. An empty array keeps its element
    /// type here, which [`MetaValue`] does not record. `None` if `index` is out of range, and for a model
    /// read from a Hugging Face directory (no GGUF bytes).
    pub fn metadata_raw(&self, index: usize) -> Option<&[u8]> {
        let span = self.metadata_spans.get(index)?;
        self.backing.bytes().get(span.clone())
    }

    /// The value stored under `key`, if any.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn model_err(&self, what: String) -> Error {
        Error::Model {
            path: self.path.clone(),
            what,
        }
    }

    fn require(&self, key: &str) -> Result<&MetaValue> {
        self.get(key)
            .ok_or_else(|| self.model_err(format!("metadata key '{key}' not found")))
    }

    fn get_int<T: TryFrom<i128>>(&self, key: &str, want: &str) -> Result<T> {
        let v = self.require(key)?;
        let i = v.as_i128().ok_or_else(|| {
            self.model_err(format!(
                "metadata key '{key}' is {}, expected an integer ({want})",
                v.describe()
            ))
        })?;
        T::try_from(i).map_err(|_| {
            self.model_err(format!(
                "metadata key '{key}' = {i} ({}) does not fit in {want}",
                v.type_name()
            ))
        })
    }

    /// `key` as a u32. Accepts any integer type whose value fits (GGUF writers differ: gguf-py writes
    /// most hyperparameters as u32, some converters as i32 or u64).
    ///
    /// Errors: [`Error::Model`] naming the file and key if it is missing, not an integer (naming the
    /// type found) or out of range.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.get_int(key, "u32")
    }

    /// `key` as a u64; any integer type whose value is non-negative. Errors as [`GgufFile::get_u32`].
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get_int(key, "u64")
    }

    /// `key` as an f32; accepts `F32`, or `F64` narrowed to the nearest f32 (integers are refused).
    ///
    /// Errors: [`Error::Model`] naming the file and key if it is missing, not a float, or a finite f64
    /// outside the f32 range.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        match *v {
            MetaValue::F32(x) => Ok(x),
            MetaValue::F64(x) => {
                let y = x as f32;
                if x.is_finite() && y.is_infinite() {
                    Err(self.model_err(format!(
                        "metadata key '{key}' = {x} (f64) does not fit in f32"
                    )))
                } else {
                    Ok(y)
                }
            }
            _ => Err(self.model_err(format!(
                "metadata key '{key}' is {}, expected a float (f32 or f64)",
                v.describe()
            ))),
        }
    }

    /// `key` as a bool. Errors: [`Error::Model`] if missing or not a `Bool`.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| {
            self.model_err(format!(
                "metadata key '{key}' is {}, expected bool",
                v.describe()
            ))
        })
    }

    /// `key` as a string. Errors: [`Error::Model`] if missing or not a `String`.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| {
            self.model_err(format!(
                "metadata key '{key}' is {}, expected string",
                v.describe()
            ))
        })
    }

    /// `key` as an array of any element type. Errors: [`Error::Model`] if missing or not an `Array`.
    pub fn get_array(&self, key: &str) -> Result<&[MetaValue]> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| {
            self.model_err(format!(
                "metadata key '{key}' is {}, expected an array",
                v.describe()
            ))
        })
    }

    /// Map every element of the array under `key`, or name the first element that does not convert.
    fn map_array<'s, T>(
        &'s self,
        key: &str,
        want: &str,
        f: impl Fn(&'s MetaValue) -> Option<T>,
    ) -> Result<Vec<T>> {
        let items = self.get_array(key)?;
        items
            .iter()
            .enumerate()
            .map(|(i, e)| {
                f(e).ok_or_else(|| {
                    self.model_err(format!(
                        "metadata key '{key}' element {i} is {} ({e}), expected {want}",
                        e.describe()
                    ))
                })
            })
            .collect()
    }

    /// `key` as an array of strings (e.g. `tokenizer.ggml.tokens`), borrowed from the file's metadata.
    ///
    /// Errors: [`Error::Model`] if missing, not an array, or an element is not a string (naming it).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.map_array(key, "string", MetaValue::as_str)
    }

    /// `key` as an array of f32 (e.g. `tokenizer.ggml.scores`); `F64` elements are narrowed.
    ///
    /// Errors: [`Error::Model`] if missing, not an array, or an element is not a float.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.map_array(key, "f32 or f64", |e| e.as_f64().map(|x| x as f32))
    }

    /// `key` as an array of i32 (e.g. `tokenizer.ggml.token_type`); any integer element type whose
    /// values fit.
    ///
    /// Errors: [`Error::Model`] if missing, not an array, or an element is not an integer that fits.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.map_array(key, "an integer that fits in i32", |e| {
            e.as_i128().and_then(|x| i32::try_from(x).ok())
        })
    }

    /// The tensors per ggml type, most elements first (ties by type id): what `gguf-dump` and
    /// llama.cpp's model loader (`llama_model_loader`: "type q4_1: 210 tensors") list.
    pub fn type_counts(&self) -> Vec<TypeCount> {
        let mut out: Vec<TypeCount> = Vec::new();
        for t in &self.tensors {
            match out.iter_mut().find(|c| c.ggml_type == t.ggml_type) {
                Some(c) => {
                    c.tensors += 1;
                    c.elements += t.n_elements;
                    c.bytes += t.n_bytes as u64;
                }
                None => out.push(TypeCount {
                    ggml_type: t.ggml_type,
                    tensors: 1,
                    elements: t.n_elements,
                    bytes: t.n_bytes as u64,
                }),
            }
        }
        out.sort_by_key(|c| (std::cmp::Reverse(c.elements), c.ggml_type.id()));
        out
    }

    /// Bits per weight as llama.cpp's model loader prints it (`file size = … (… BPW)`): 8 × the bytes of
    /// all tensor data over all their elements (metadata not counted). `None` for a file without
    /// tensors.
    pub fn bits_per_weight(&self) -> Option<f64> {
        let (bytes, elements) = self.tensors.iter().fold((0u64, 0u64), |(b, e), t| {
            (b + t.n_bytes as u64, e + t.n_elements)
        });
        (elements > 0).then(|| bytes as f64 * 8.0 / elements as f64)
    }

    /// The tensor-info table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    ///
    /// Errors: [`Error::Model`] "tensor 'X' not found" naming the file.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| self.model_err(format!("tensor '{name}' not found")))
    }

    /// The `t.n_bytes` bytes of `t`'s data, in place in the file (ggml block layout, little-endian).
    ///
    /// For a [`TensorInfo`] taken from this file the range was checked at parse time, so this never
    /// fails. A `TensorInfo` from another file (or edited by the caller) whose range does not lie in
    /// this file gets an empty slice rather than a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        self.backing.range(t.offset, t.n_bytes).unwrap_or(&[])
    }

    /// The data of the tensor called `name`: [`GgufFile::tensor`] then [`GgufFile::tensor_data`].
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        Ok(self.tensor_data(self.tensor(name)?))
    }
}

#[cfg(test)]
mod tests;
