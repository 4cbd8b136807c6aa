//! GGUF metadata values (`gguf_type` in the GGUF spec, `GGUFValueType` in gguf-py).

/// One metadata value, as stored in a GGUF key/value pair.
///
/// The variants are the thirteen GGUF value types of the GGUF spec (ggml/docs/gguf.md,
/// `enum gguf_metadata_value_type`), in id order: `U8` = 0 … `F64` = 12. Integers and floats are
/// little-endian in the file; `Bool` is one byte (any nonzero byte reads as `true`, as in llama.cpp's
/// `gguf_reader::read(bool&)`); `String` is a u64 byte length followed by UTF-8 bytes (no terminator);
/// `Array` is an element type id (u32), a u64 count and the elements, which may themselves be arrays
/// (the spec and gguf-py allow this; llama.cpp's reader does not).
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// GGUF type 0.
    U8(u8),
    /// GGUF type 1.
    I8(i8),
    /// GGUF type 2.
    U16(u16),
    /// GGUF type 3.
    I16(i16),
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 5.
    I32(i32),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 7.
    Bool(bool),
    /// GGUF type 8.
    String(String),
    /// GGUF type 9. All elements have the same type (the format stores one element type per array).
    Array(Vec<MetaValue>),
    /// GGUF type 10.
    U64(u64),
    /// GGUF type 11.
    I64(i64),
    /// GGUF type 12.
    F64(f64),
}

/// GGUF value type ids (GGUF spec `gguf_metadata_value_type`).
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// The name of a GGUF value type id, or `None` if the id is not one the spec defines.
pub(crate) fn type_name_of_id(id: u32) -> Option<&'static str> {
    Some(match id {
        type_id::U8 => "u8",
        type_id::I8 => "i8",
        type_id::U16 => "u16",
        type_id::I16 => "i16",
        type_id::U32 => "u32",
        type_id::I32 => "i32",
        type_id::F32 => "f32",
        type_id::BOOL => "bool",
        type_id::STRING => "string",
        type_id::ARRAY => "array",
        type_id::U64 => "u64",
        type_id::I64 => "i64",
        type_id::F64 => "f64",
        _ => return None,
    })
}

impl MetaValue {
    /// The GGUF type name of this value: `u8`, `i8`, `u16`, `i16`, `u32`, `i32`, `f32`, `bool`,
    /// `string`, `array`, `u64`, `i64` or `f64` (gguf.cpp's `GGUF_TYPE_NAME`, with `string`/`array`
    /// spelled out). Use [`MetaValue::describe`] for an array's element type and length.
    pub fn type_name(&self) -> &'static str {
        type_name_of_id(self.type_id()).unwrap_or("?")
    }

    /// The GGUF value type id (0..=12) this value is stored as.
    pub fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => type_id::U8,
            MetaValue::I8(_) => type_id::I8,
            MetaValue::U16(_) => type_id::U16,
            MetaValue::I16(_) => type_id::I16,
            MetaValue::U32(_) => type_id::U32,
            MetaValue::I32(_) => type_id::I32,
            MetaValue::F32(_) => type_id::F32,
            MetaValue::Bool(_) => type_id::BOOL,
            MetaValue::String(_) => type_id::STRING,
            MetaValue::Array(_) => type_id::ARRAY,
            MetaValue::U64(_) => type_id::U64,
            MetaValue::I64(_) => type_id::I64,
            MetaValue::F64(_) => type_id::F64,
        }
    }

    /// A short human description for error messages: the type name for scalars, `array of 3 u32`,
    /// `array of 2 array`, or `empty array`.
    pub fn describe(&self) -> String {
        match self {
            MetaValue::Array(v) if v.is_empty() => "empty array".to_string(),
            MetaValue::Array(v) => format!("array of {} {}", v.len(), v[0].type_name()),
            other => other.type_name().to_string(),
        }
    }

    /// Any integer variant as `i128` (which holds every GGUF integer exactly); `None` for non-integers
    /// (floats, bools, strings, arrays).
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(x) => x.into(),
            MetaValue::I8(x) => x.into(),
            MetaValue::U16(x) => x.into(),
            MetaValue::I16(x) => x.into(),
            MetaValue::U32(x) => x.into(),
            MetaValue::I32(x) => x.into(),
            MetaValue::U64(x) => x.into(),
            MetaValue::I64(x) => x.into(),
            _ => return None,
        })
    }

    /// Any integer variant whose value is in `0..=u64::MAX`; `None` for negative integers and
    /// non-integers.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|x| u64::try_from(x).ok())
    }

    /// Any integer variant whose value fits in `i64`; `None` otherwise.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|x| i64::try_from(x).ok())
    }

    /// `F32` (widened) or `F64`; `None` for every other variant (integers are not converted).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(x) => Some(x.into()),
            MetaValue::F64(x) => Some(x),
            _ => None,
        }
    }

    /// The value of a `Bool`; `None` otherwise.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The text of a `String`; `None` otherwise.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of an `Array`; `None` otherwise.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

impl std::fmt::Display for MetaValue {
    /// Scalars print their value (strings quoted with Rust escapes); arrays print up to 8 elements and
    /// then `… (N total)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetaValue::U8(x) => write!(f, "{x}"),
            MetaValue::I8(x) => write!(f, "{x}"),
            MetaValue::U16(x) => write!(f, "{x}"),
            MetaValue::I16(x) => write!(f, "{x}"),
            MetaValue::U32(x) => write!(f, "{x}"),
            MetaValue::I32(x) => write!(f, "{x}"),
            MetaValue::F32(x) => write!(f, "{x}"),
            MetaValue::Bool(x) => write!(f, "{x}"),
            MetaValue::String(s) => write!(f, "{s:?}"),
            MetaValue::U64(x) => write!(f, "{x}"),
            MetaValue::I64(x) => write!(f, "{x}"),
            MetaValue::F64(x) => write!(f, "{x}"),
            MetaValue::Array(v) => {
                const SHOWN: usize = 8;
                f.write_str("[")?;
                for (i, e) in v.iter().take(SHOWN).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{e}")?;
                }
                if v.len() > SHOWN {
                    write!(f, ", … ({} total)", v.len())?;
                }
                f.write_str("]")
            }
        }
    }
}
