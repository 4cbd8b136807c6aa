//! One bounded reader of NumPy `.npz` archives, shared by goldens ([`crate::golden`]) and dumps
//! ([`crate::dump`]).
//!
//! An `.npz` is a zip archive of `.npy` members (numpy's `numpy.lib.format`: magic `\x93NUMPY`, a version,
//! a Python-dict header with `descr`, `fortran_order` and `shape`, then the raw C-order data). Both kinds
//! of file are input the harness does not trust, so every read is bounded *before* anything is
//! decompressed: the caller states how many data bytes the member may hold, the member's declared size in
//! the zip directory is checked against it, decompression stops at that size, and the `.npy` header's
//! shape must account for exactly the data bytes present. A zip bomb or a header claiming `2^60`
//! elements is an error naming the file and member, not an allocation.
//!
//! Only little-endian `<f2`, `<f4` and `<i4` arrays are read ([`Dtype`]); that is all the golden and dump
//! contracts hold.

use std::fmt;
use std::io::{BufReader, Cursor, Read, Seek};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use ndarray::Array2;
use serde::{Deserialize, Serialize};

/// Largest `.npy` header accepted (numpy writes ≤ 4 KiB even for long shapes).
pub const MAX_NPY_HEADER_BYTES: u64 = 64 * 1024;

/// Largest data of one array any reader accepts (1 GiB: a full-logits golden of the largest registered
/// vocabulary at 4096 positions is 2.5 GB in f32, so goldens store top-k rows instead; 1 GiB is ~10× the
/// largest array the committed goldens or a 512-token dump of the registered models hold).
pub const MAX_ARRAY_BYTES: u64 = 1 << 30;

/// Element type of a stored array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE half, npy `<f2`.
    F16,
    /// IEEE single, npy `<f4`.
    F32,
    /// 32-bit signed integer, npy `<i4`.
    I32,
}

impl Dtype {
    /// The npy `descr` of this type (little-endian).
    pub fn npy_descr(self) -> &'static str {
        match self {
            Dtype::F16 => "<f2",
            Dtype::F32 => "<f4",
            Dtype::I32 => "<i4",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
        }
    }

    /// The type of an npy `descr` (`<f2`, `<f4`, `<i4`), if this module reads it.
    pub fn from_descr(descr: &str) -> Option<Dtype> {
        match descr {
            "<f2" => Some(Dtype::F16),
            "<f4" => Some(Dtype::F32),
            "<i4" => Some(Dtype::I32),
            _ => None,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
            Dtype::I32 => "i32",
        })
    }
}

/// Bytes of data an array of `shape` and `dtype` holds; `None` on overflow.
pub fn data_bytes(shape: &[usize], dtype: Dtype) -> Option<u64> {
    shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64))
}

/// One `.npy` array as stored: shape (outermost first), element type, raw little-endian data.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyArray {
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: Dtype,
    /// `shape.product() * dtype.size()` bytes, little-endian, C order.
    pub data: Vec<u8>,
}

impl NpyArray {
    /// `(rows, cols)` of a 1-D (`[n]` → `(1, n)`) or 2-D array; errors for other ranks.
    fn dims2(&self) -> Result<(usize, usize)> {
        match *self.shape {
            [n] => Ok((1, n)),
            [r, c] => Ok((r, c)),
            _ => bail!("shape {:?}: only 1-D and 2-D arrays are read", self.shape),
        }
    }

    /// The values as f32 (`<f2` widened exactly), as `[rows, cols]` (1-D → `[1, n]`).
    ///
    /// Errors: an i32 array, a rank other than 1 or 2.
    pub fn to_f32(&self) -> Result<Array2<f32>> {
        let values: Vec<f32> = match self.dtype {
            Dtype::F32 => self
                .data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => self
                .data
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::I32 => bail!("the array is i32, not a float array"),
        };
        Ok(Array2::from_shape_vec(self.dims2()?, values)?)
    }

    /// The values of an i32 array as `[rows, cols]` (1-D → `[1, n]`).
    ///
    /// Errors: a float array, a rank other than 1 or 2.
    pub fn to_i32(&self) -> Result<Array2<i32>> {
        if self.dtype != Dtype::I32 {
            bail!("the array is {}, not i32", self.dtype);
        }
        let values = self
            .data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Array2::from_shape_vec(self.dims2()?, values)?)
    }
}

/// Anything an archive can be read from.
pub trait ReadSeek: Read + Seek + Send {}
impl<T: Read + Seek + Send> ReadSeek for T {}

/// An open `.npz` archive. Every error names [`Npz::path`] (the file, or the label given to
/// [`Npz::from_bytes`]).
pub struct Npz {
    path: PathBuf,
    zip: zip::ZipArchive<Box<dyn ReadSeek>>,
}

impl Npz {
    /// Open an `.npz` file of any size. Errors: the file is missing or unreadable, not a regular file (a
    /// FIFO, a device: [`crate::input::open`]), or not a zip archive.
    pub fn open(path: &Path) -> Result<Npz> {
        Npz::open_capped(path, "the .npz file", u64::MAX)
    }

    /// Open an `.npz` file `what` names in errors (e.g. "the dump"), of at most `max_bytes` on disk.
    /// Errors: as [`Npz::open`]; the file is larger than `max_bytes`.
    pub fn open_capped(path: &Path, what: &str, max_bytes: u64) -> Result<Npz> {
        let f = crate::input::open(path, what, max_bytes)?;
        Npz::from_reader(Box::new(BufReader::new(f)), path)
    }

    /// An archive held in memory; `label` names it in errors (fuzzing, tests).
    pub fn from_bytes(bytes: Vec<u8>, label: &Path) -> Result<Npz> {
        Npz::from_reader(Box::new(Cursor::new(bytes)), label)
    }

    fn from_reader(reader: Box<dyn ReadSeek>, path: &Path) -> Result<Npz> {
        let zip = zip::ZipArchive::new(reader)
            .with_context(|| format!("{} is not a valid .npz (zip) file", path.display()))?;
        Ok(Npz {
            path: path.to_path_buf(),
            zip,
        })
    }

    /// The file (or label) this archive was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The archive's member names as stored (`tokens.npy`, ...).
    pub fn members(&self) -> Vec<String> {
        self.zip.file_names().map(str::to_string).collect()
    }

    /// The array names (members without `.npy`). Errors: a member that is not a `.npy` array.
    pub fn array_names(&self) -> Result<Vec<String>> {
        self.members()
            .into_iter()
            .map(|m| match m.strip_suffix(".npy") {
                Some(n) => Ok(n.to_string()),
                None => Err(anyhow!(
                    "{}: member `{m}` is not a .npy array",
                    self.path.display()
                )),
            })
            .collect()
    }

    /// Whether the archive has array `name` (member `name.npy`).
    pub fn has(&self, name: &str) -> bool {
        self.zip.index_for_name(&format!("{name}.npy")).is_some()
    }

    /// Read array `name` holding at most `max_data_bytes` of data (capped at [`MAX_ARRAY_BYTES`]).
    ///
    /// The member's declared uncompressed size is checked against the bound before decompressing;
    /// decompression stops at the bound; the header must be a little-endian, C-order `.npy` of a type
    /// [`Dtype`] names, and its shape must account for exactly the data bytes present. Errors name the
    /// file and array: missing member, oversized member, corrupt deflate stream or CRC, bad header.
    pub fn read(&mut self, name: &str, max_data_bytes: u64) -> Result<NpyArray> {
        let path = self.path.display().to_string();
        let cap = max_data_bytes.min(MAX_ARRAY_BYTES);
        let member = format!("{name}.npy");
        let mut f = match self.zip.by_name(&member) {
            Ok(f) => f,
            Err(zip::result::ZipError::FileNotFound) => {
                bail!("{path}: array `{name}` is not in the file")
            }
            Err(e) => {
                return Err(e).with_context(|| format!("{path}: array `{name}` cannot be read"))
            }
        };
        let limit = cap + MAX_NPY_HEADER_BYTES;
        let declared = f.size();
        if declared > limit {
            bail!(
                "{path}: array `{name}` declares {declared} bytes uncompressed, more than the {limit} \
                 it may hold here; refusing to decompress it"
            );
        }
        // the declared size is a claim: grow past 1 MiB only as bytes actually arrive
        let mut bytes = Vec::with_capacity(declared.min(1 << 20) as usize);
        (&mut f)
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("{path}: array `{name}` cannot be decompressed"))?;
        if bytes.len() as u64 > limit {
            bail!("{path}: array `{name}` decompresses to more than the {limit} bytes it may hold");
        }
        drop(f);
        let (descr, shape, offset) =
            parse_npy_header(&bytes).with_context(|| format!("{path}: array `{name}`"))?;
        let dtype = Dtype::from_descr(&descr).ok_or_else(|| {
            anyhow!("{path}: array `{name}` has npy dtype {descr:?}; only <f2, <f4, <i4 are read")
        })?;
        let need = data_bytes(&shape, dtype)
            .filter(|&n| n <= cap)
            .ok_or_else(|| {
                anyhow!(
                    "{path}: array `{name}` claims shape {shape:?} of {dtype}, more than the {cap} data \
                     bytes it may hold"
                )
            })?;
        let data = bytes.split_off(offset);
        if data.len() as u64 != need {
            bail!(
                "{path}: array `{name}` has {} data bytes, shape {shape:?} of {dtype} needs {need}",
                data.len()
            );
        }
        Ok(NpyArray { shape, dtype, data })
    }
}

/// Parse a little-endian, C-order `.npy` header: returns (descr, shape, offset of the data).
///
/// Source: numpy's `numpy/lib/format.py` (`_read_array_header`): versions 1.0 (u16 header length) and
/// 2.0/3.0 (u32), header a Python dict literal.
pub fn parse_npy_header(bytes: &[u8]) -> Result<(String, Vec<usize>, usize)> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        bail!("not a .npy array (bad magic)");
    }
    let major = bytes[6];
    let (len, start): (usize, usize) = match major {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 => {
            if bytes.len() < 12 {
                bail!("truncated .npy header");
            }
            let n = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            (usize::try_from(n)?, 12)
        }
        v => bail!(".npy format version {v} is not supported"),
    };
    if len as u64 > MAX_NPY_HEADER_BYTES {
        bail!(".npy header of {len} bytes is longer than {MAX_NPY_HEADER_BYTES}");
    }
    let end = start
        .checked_add(len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| anyhow!("truncated .npy header"))?;
    let header =
        std::str::from_utf8(&bytes[start..end]).map_err(|_| anyhow!(".npy header is not text"))?;
    let descr = dict_value(header, "descr")?;
    let descr = descr
        .trim()
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .ok_or_else(|| anyhow!(".npy header: descr is not a string: {header}"))?
        .to_string();
    match dict_value(header, "fortran_order")?.trim() {
        "False" => {}
        "True" => bail!(".npy array is in Fortran order; only C order is read"),
        other => bail!(".npy header: fortran_order is {other:?}"),
    }
    let shape_text = dict_value(header, "shape")?;
    let inner = shape_text
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| anyhow!(".npy header: shape is not a tuple: {header}"))?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| anyhow!(".npy header: bad dimension {s:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((descr, shape, end))
}

/// The text of `'key': <value>` in a Python dict literal, up to the next top-level comma.
fn dict_value<'a>(header: &'a str, key: &str) -> Result<&'a str> {
    let pat = format!("'{key}':");
    let at = header
        .find(&pat)
        .ok_or_else(|| anyhow!(".npy header has no {key}: {header}"))?;
    let rest = &header[at + pat.len()..];
    let mut depth = 0i32;
    for (i, ch) in rest.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' | '}' if depth == 0 => return Ok(&rest[..i]),
            _ => {}
        }
    }
    bail!(".npy header: unterminated {key}: {header}")
}

/// A `.npy` member's bytes (version 1.0 header) for `data` of `shape` and `dtype` (tests and fixtures).
pub fn npy_bytes(dtype: Dtype, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut h = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_text}, }}",
        dtype.npy_descr()
    );
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut v = b"\x93NUMPY\x01\x00".to_vec();
    v.extend_from_slice(&(h.len() as u16).to_le_bytes());
    v.extend_from_slice(h.as_bytes());
    v.extend_from_slice(data);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn archive(members: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut buf = Cursor::new(Vec::new());
        {
            let mut z = zip::ZipWriter::new(&mut buf);
            let o = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated);
            for (name, bytes) in members {
                z.start_file(*name, o).unwrap();
                z.write_all(bytes).unwrap();
            }
            z.finish().unwrap();
        }
        buf.into_inner()
    }

    #[test]
    fn npy_headers_parse() {
        let v = npy_bytes(Dtype::F16, &[37, 576], &[]);
        let (descr, shape, off) = parse_npy_header(&v).unwrap();
        assert_eq!(descr, "<f2");
        assert_eq!(shape, vec![37, 576]);
        assert_eq!(off, v.len());
        let w = npy_bytes(Dtype::I32, &[14], &[]);
        assert_eq!(parse_npy_header(&w).unwrap().1, vec![14]);
        assert!(parse_npy_header(b"PK\x03\x04 not npy").is_err());
    }

    #[test]
    fn arrays_round_trip_and_bounds_hold() {
        let data: Vec<u8> = [1.5f32, -2.0, 3.25, 0.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let bytes = archive(&[("a.npy", npy_bytes(Dtype::F32, &[2, 2], &data))]);
        let mut z = Npz::from_bytes(bytes, Path::new("x.npz")).unwrap();
        assert_eq!(z.array_names().unwrap(), vec!["a".to_string()]);
        let a = z.read("a", 16).unwrap().to_f32().unwrap();
        assert_eq!(a, ndarray::array![[1.5f32, -2.0], [3.25, 0.0]]);
        // a bound below the data size is refused by the header's shape
        let e = format!("{:#}", z.read("a", 8).unwrap_err());
        assert!(
            e.contains("x.npz") && e.contains("`a`") && e.contains("more than the 8"),
            "{e}"
        );
        let e = format!("{:#}", z.read("b", 8).unwrap_err());
        assert!(e.contains("`b` is not in the file"), "{e}");
    }

    #[test]
    fn a_header_claiming_more_than_its_data_is_refused() {
        // a 2^40-element shape over 4 bytes of data: no allocation, a clear error
        let bomb = archive(&[("a.npy", npy_bytes(Dtype::F32, &[1 << 20, 1 << 20], &[0; 4]))]);
        let mut z = Npz::from_bytes(bomb, Path::new("b.npz")).unwrap();
        let e = format!("{:#}", z.read("a", u64::MAX).unwrap_err());
        assert!(e.contains("b.npz") && e.contains("claims shape"), "{e}");
        let overflow = archive(&[("a.npy", npy_bytes(Dtype::F32, &[usize::MAX, 3], &[0; 4]))]);
        let mut z = Npz::from_bytes(overflow, Path::new("o.npz")).unwrap();
        assert!(z.read("a", u64::MAX).is_err());
        let short = archive(&[("a.npy", npy_bytes(Dtype::I32, &[3], &[0; 8]))]);
        let mut z = Npz::from_bytes(short, Path::new("s.npz")).unwrap();
        let e = format!("{:#}", z.read("a", 100).unwrap_err());
        assert!(
            e.contains("has 8 data bytes") && e.contains("needs 12"),
            "{e}"
        );
    }

    #[test]
    fn a_highly_compressed_member_is_refused_by_its_declared_size() {
        // 64 MiB of zeros compresses to ~64 KiB; a reader with a 1 MiB bound never inflates it
        let big = npy_bytes(Dtype::F32, &[1 << 24], &vec![0u8; 1 << 26]);
        let bytes = archive(&[("z.npy", big)]);
        assert!(bytes.len() < 1 << 20);
        let mut z = Npz::from_bytes(bytes, Path::new("z.npz")).unwrap();
        let e = format!("{:#}", z.read("z", 1 << 20).unwrap_err());
        assert!(e.contains("declares") && e.contains("refusing"), "{e}");
    }

    #[test]
    fn non_npy_members_are_named() {
        let z = Npz::from_bytes(
            archive(&[("readme.txt", b"hi".to_vec())]),
            Path::new("r.npz"),
        )
        .unwrap();
        let e = format!("{:#}", z.array_names().unwrap_err());
        assert!(e.contains("r.npz") && e.contains("readme.txt"), "{e}");
    }
}
