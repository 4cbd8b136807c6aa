//! An in-memory GGUF writer for tests and synthetic fixtures.

use super::parse::{align_up, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC};
use super::value::{type_id, MetaValue};
use crate::quant::GgmlType;

/// Builds a GGUF file in memory: version 3, alignment 32 unless `general.alignment` is set.
///
/// The layout is the one llama.cpp's `gguf_write_to_buf` and gguf-py's `GGUFWriter` produce: header,
/// metadata in insertion order, tensor infos in insertion order, padding to the alignment, then each
/// tensor's data padded to the alignment (the last one too), offsets packed in table order. The result
/// therefore also loads in llama.cpp.
///
/// It writes what it is given, so tests can build files the reader must reject (a duplicate key, a bad
/// `general.alignment`, version 1). The alignment used for padding is `general.alignment` when that is
/// a nonzero power-of-two u32, and 32 otherwise.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
}

#[derive(Clone, Debug)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty v3 file: no metadata, no tensors.
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Set the version number written in the header (default 3). Versions 2 and 3 share one layout;
    /// other values are written as given, for tests of the reader's version check.
    pub fn set_version(&mut self, version: u32) {
        self.version = version;
    }

    /// Set `general.alignment` (a u32; replaces an existing entry in place, else appends one).
    pub fn set_alignment(&mut self, alignment: u32) {
        let v = MetaValue::U32(alignment);
        match self.metadata.iter_mut().find(|(k, _)| k == ALIGNMENT_KEY) {
            Some(entry) => entry.1 = v,
            None => self.metadata.push((ALIGNMENT_KEY.to_string(), v)),
        }
    }

    /// Append a metadata pair. Duplicate keys are written as given (the reader rejects them).
    ///
    /// An empty array is written with element type u8 (a [`MetaValue::Array`] does not record the
    /// element type of an empty array).
    ///
    /// # Panics
    /// If an array (at any nesting level) mixes element types, which GGUF cannot represent.
    pub fn add_metadata(&mut self, key: &str, value: MetaValue) {
        check_homogeneous(key, &value);
        self.metadata.push((key.to_string(), value));
    }

    /// Append a tensor. `dims` are in ggml `ne` order (`dims[0]` = row length) and `data` is its bytes in
    /// ggml layout.
    ///
    /// # Panics
    /// If `data.len()` is not the byte size of `dims` elements of `ty` (including when `dims[0]` is not
    /// a whole number of blocks): that is a bug in the fixture, not a file to test the reader with.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) {
        let n: Option<u64> = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let want = n.and_then(|n| ty.bytes_for(n));
        let row_ok = dims
            .first()
            .is_some_and(|&d| d % ty.block_size() as u64 == 0);
        assert!(
            row_ok && want == Some(data.len()),
            "GgufWriter::add_tensor('{name}'): {} bytes given, but shape {dims:?} of type {ty} needs {}",
            data.len(),
            match want {
                Some(b) if row_ok => format!("{b} bytes"),
                _ => "a row length that is a whole number of blocks".to_string(),
            }
        );
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            data,
        });
    }

    fn alignment(&self) -> u64 {
        match self.metadata.iter().rev().find(|(k, _)| k == ALIGNMENT_KEY) {
            Some((_, MetaValue::U32(a))) if *a != 0 && a.is_power_of_two() => u64::from(*a),
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// The complete file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment();
        let pad = |out: &mut Vec<u8>| {
            let target = align_up(out.len() as u64, align).unwrap_or(out.len() as u64);
            out.resize(target as usize, 0);
        };
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_str(&mut out, key);
            out.extend_from_slice(&value.type_id().to_le_bytes());
            write_value(&mut out, value);
        }
        let mut rel = 0u64;
        for t in &self.tensors {
            write_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&rel.to_le_bytes());
            rel = align_up(rel + t.data.len() as u64, align).unwrap_or(u64::MAX);
        }
        pad(&mut out);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            pad(&mut out);
        }
        out
    }
}

fn check_homogeneous(key: &str, v: &MetaValue) {
    if let MetaValue::Array(items) = v {
        if let Some(first) = items.first() {
            let t = first.type_id();
            if let Some((i, e)) = items.iter().enumerate().find(|(_, e)| e.type_id() != t) {
                panic!(
                    "GgufWriter::add_metadata('{key}'): array mixes {} (element 0) and {} (element {i})",
                    first.type_name(),
                    e.type_name()
                );
            }
        }
        for e in items {
            check_homogeneous(key, e);
        }
    }
}

/// One metadata entry as GGUF encodes it: key (u64 length + bytes), value type id (u32), value (an array
/// as element type, u64 count, elements; an empty array gets element type u8).
pub(crate) fn encode_entry(key: &str, value: &MetaValue) -> Vec<u8> {
    let mut out = Vec::new();
    write_str(&mut out, key);
    out.extend_from_slice(&value.type_id().to_le_bytes());
    write_value(&mut out, value);
    out
}

pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A value's payload (without its type id; arrays carry their element type and count).
fn write_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => write_str(out, s),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Array(items) => {
            let elem = items.first().map_or(type_id::U8, MetaValue::type_id);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for e in items {
                write_value(out, e);
            }
        }
    }
}
