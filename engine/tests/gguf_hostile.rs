//! The GGUF reader against malformed and hostile files: every one must be refused with an
//! `Error::Gguf` that names the file, points at the bad field and says what is wrong; none may panic
//! or allocate more than the file could hold. Plus one test on the real SmolLM2 model file (ignored by
//! default: it needs the model downloaded).

use std::path::PathBuf;

use lockstep_engine::gguf::{GgufFile, GgufWriter, MetaValue};
use lockstep_engine::quant::GgmlType;
use lockstep_engine::Error;

/// A valid synthetic file: metadata of several types (a tokenizer-like string array, scores, a nested
/// array) and tensors of several ggml types.
fn valid() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetaValue::String("llama".into()));
    w.add_metadata("general.name", MetaValue::String("hostile-fixture".into()));
    w.add_metadata("llama.block_count", MetaValue::U32(1));
    w.add_metadata("llama.rope.freq_base", MetaValue::F32(10000.0));
    w.add_metadata(
        "tokenizer.ggml.tokens",
        MetaValue::Array(
            ["<unk>", "<s>", "</s>", "▁a", "b"]
                .iter()
                .map(|s| MetaValue::String(s.to_string()))
                .collect(),
        ),
    );
    w.add_metadata(
        "tokenizer.ggml.scores",
        MetaValue::Array((0..5).map(|i| MetaValue::F32(-(i as f32))).collect()),
    );
    w.add_metadata(
        "test.nested",
        MetaValue::Array(vec![
            MetaValue::Array(vec![MetaValue::I64(-1), MetaValue::I64(2)]),
            MetaValue::Array(vec![MetaValue::I64(3)]),
        ]),
    );
    w.add_metadata("test.flag", MetaValue::Bool(true));
    let data = |n: usize| (0..n).map(|i| (i * 7 + 3) as u8).collect::<Vec<u8>>();
    w.add_tensor("token_embd.weight", &[32, 5], GgmlType::Q8_0, data(5 * 34));
    w.add_tensor("blk.0.attn_norm.weight", &[32], GgmlType::F32, data(32 * 4));
    w.add_tensor(
        "blk.0.attn_q.weight",
        &[32, 32],
        GgmlType::Q4_1,
        data(32 * 20),
    );
    w.add_tensor("output_norm.weight", &[24], GgmlType::F16, data(48));
    w.to_bytes()
}

/// Byte position of the first occurrence of `needle`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not in file", String::from_utf8_lossy(needle)))
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Where a metadata key's value type id is (its value follows 4 bytes later).
fn kv_type_at(b: &[u8], key: &str) -> usize {
    find(b, key.as_bytes()) + key.len()
}

/// Field positions of a tensor-info record.
struct TensorFields {
    n_dims: usize,
    dims: usize,
    ty: usize,
    offset: usize,
}

fn tensor_fields(b: &[u8], name: &str) -> TensorFields {
    let n_dims = find(b, name.as_bytes()) + name.len();
    let nd = u32::from_le_bytes(b[n_dims..n_dims + 4].try_into().unwrap()) as usize;
    let dims = n_dims + 4;
    let ty = dims + 8 * nd;
    TensorFields {
        n_dims,
        dims,
        ty,
        offset: ty + 4,
    }
}

/// Parse `bytes` as `label`, expect an `Error::Gguf`, and check it names the label and contains each
/// of `wants`. Returns (offset, message).
#[track_caller]
fn expect_gguf_err(bytes: Vec<u8>, label: &str, wants: &[&str]) -> (u64, String) {
    let e = match GgufFile::from_bytes(bytes, label) {
        Ok(_) => panic!("{label}: parsed, but should have been refused"),
        Err(e) => e,
    };
    let msg = e.to_string();
    let offset = match e {
        Error::Gguf {
            ref path, offset, ..
        } => {
            assert_eq!(path, &PathBuf::from(label));
            offset
        }
        other => panic!("{label}: expected Error::Gguf, got {other:?}"),
    };
    assert!(
        msg.starts_with(&format!("{label}: invalid GGUF at byte offset {offset}: ")),
        "{msg}"
    );
    for w in wants {
        assert!(msg.contains(w), "{msg:?} should mention {w:?}");
    }
    (offset, msg)
}

#[test]
fn fixture_is_valid() {
    let g = GgufFile::from_bytes(valid(), "fixture.gguf").unwrap();
    assert_eq!(g.tensors().len(), 4);
    assert_eq!(g.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 5);
}

#[test]
fn truncated_at_every_cut_is_refused() {
    let file = valid();
    let g = GgufFile::from_bytes(file.clone(), "full").unwrap();
    let data_end = g
        .tensors()
        .iter()
        .map(|t| t.offset as usize + t.n_bytes)
        .max()
        .unwrap();
    assert!(
        data_end < file.len(),
        "the writer pads after the last tensor"
    );
    for cut in 0..file.len() {
        let label = format!("cut-{cut}.gguf");
        let r = GgufFile::from_bytes(file[..cut].to_vec(), &label);
        if cut < data_end {
            let e = r.expect_err(&label).to_string();
            assert!(e.contains(&label), "{e}");
            assert!(
                e.contains("end of file")
                    || e.contains("remain")
                    || e.contains("too short")
                    || e.contains("file is only")
                    || e.contains("is impossible"),
                "cut {cut}: {e}"
            );
        } else {
            // Only the padding after the last tensor is missing: nothing the file describes is.
            assert!(
                r.is_ok(),
                "cut {cut} inside the trailing padding: {:?}",
                r.err()
            );
        }
    }
}

#[test]
fn tensor_offset_past_end() {
    let mut b = valid();
    let f = tensor_fields(&b, "output_norm.weight");
    put_u64(&mut b, f.offset, 1 << 20);
    let (off, _) = expect_gguf_err(
        b,
        "past-end.gguf",
        &[
            "tensor 'output_norm.weight' data [offset ",
            "48 bytes] extends past end of file (size ",
        ],
    );
    assert_eq!(off, f.offset as u64);

    // An offset whose absolute position overflows u64 is reported the same way, not wrapped.
    let mut b = valid();
    put_u64(&mut b, f.offset, u64::MAX - 31);
    expect_gguf_err(
        b,
        "overflow.gguf",
        &["'output_norm.weight'", "extends past end of file"],
    );
}

#[test]
fn tensor_offset_misaligned() {
    let mut b = valid();
    let f = tensor_fields(&b, "blk.0.attn_q.weight");
    let old = u64::from_le_bytes(b[f.offset..f.offset + 8].try_into().unwrap());
    put_u64(&mut b, f.offset, old + 4);
    let (off, _) = expect_gguf_err(
        b,
        "misaligned.gguf",
        &[
            "tensor 'blk.0.attn_q.weight' data offset",
            "not a multiple of the alignment 32",
        ],
    );
    assert_eq!(off, f.offset as u64);
}

#[test]
fn overlapping_tensors() {
    let mut b = valid();
    let f = tensor_fields(&b, "output_norm.weight");
    put_u64(&mut b, f.offset, 0); // on top of token_embd.weight
    expect_gguf_err(
        b,
        "overlap.gguf",
        &[
            "'output_norm.weight'",
            "overlaps tensor 'token_embd.weight'",
        ],
    );
}

#[test]
fn absurd_tensor_count() {
    let mut b = valid();
    put_u64(&mut b, 8, u64::MAX / 2);
    let (off, _) = expect_gguf_err(
        b,
        "tensors.gguf",
        &["tensor count 9223372036854775807 is impossible"],
    );
    assert_eq!(off, 8);
}

#[test]
fn absurd_metadata_count() {
    let mut b = valid();
    put_u64(&mut b, 16, u64::MAX);
    let (off, _) = expect_gguf_err(
        b,
        "kv.gguf",
        &["metadata count 18446744073709551615 is impossible"],
    );
    assert_eq!(off, 16);
}

#[test]
fn string_length_past_end() {
    let mut b = valid();
    let len_at = kv_type_at(&b, "general.name") + 4;
    put_u64(&mut b, len_at, 1 << 40);
    let (off, _) = expect_gguf_err(
        b,
        "string.gguf",
        &[
            "metadata key 'general.name' has length 1099511627776 but only",
            "bytes remain",
        ],
    );
    assert_eq!(off, len_at as u64);

    // The same for a key and for a tensor name.
    let mut b = valid();
    let key_len_at = find(&b, b"llama.block_count") - 8;
    put_u64(&mut b, key_len_at, u64::MAX);
    expect_gguf_err(
        b,
        "key.gguf",
        &["key of metadata entry 2 has length 18446744073709551615"],
    );
    let mut b = valid();
    let name_len_at = find(&b, b"blk.0.attn_norm.weight") - 8;
    put_u64(&mut b, name_len_at, 1 << 33);
    expect_gguf_err(b, "name.gguf", &["name of tensor 1 has length 8589934592"]);
}

#[test]
fn array_count_past_end() {
    let mut b = valid();
    let count_at = kv_type_at(&b, "tokenizer.ggml.tokens") + 4 + 4;
    put_u64(&mut b, count_at, u64::MAX / 8);
    let (off, _) = expect_gguf_err(
        b,
        "array.gguf",
        &[
            "metadata key 'tokenizer.ggml.tokens' claims 2305843009213693951 string elements",
            "bytes remain",
        ],
    );
    assert_eq!(off, count_at as u64);

    // f32 array: 4 bytes per element, and a count whose byte size overflows u64.
    let mut b = valid();
    let count_at = kv_type_at(&b, "tokenizer.ggml.scores") + 8;
    put_u64(&mut b, count_at, u64::MAX);
    expect_gguf_err(
        b,
        "scores.gguf",
        &["f32 elements, which need more than 2^64 bytes"],
    );

    // Inside a nested array.
    let mut b = valid();
    let inner_count_at = kv_type_at(&b, "test.nested") + 4 + 12 + 4;
    put_u64(&mut b, inner_count_at, 1 << 30);
    expect_gguf_err(
        b,
        "nested.gguf",
        &["element 0 of metadata key 'test.nested' claims 1073741824 i64"],
    );
}

#[test]
fn metadata_element_budget() {
    // A u8 array one element over the total budget, with every byte present: refused by the budget,
    // before anything is allocated for it.
    let n: u64 = (1 << 24) + 1;
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&3u64.to_le_bytes());
    b.extend_from_slice(b"big");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&n.to_le_bytes());
    b.resize(b.len() + n as usize, 0);
    expect_gguf_err(
        b,
        "budget.gguf",
        &["16777217 elements", "16777216 array elements in total"],
    );
}

#[test]
fn arrays_nested_too_deep() {
    let mut v = MetaValue::U8(1);
    for _ in 0..9 {
        v = MetaValue::Array(vec![v]);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("deep", v);
    expect_gguf_err(
        w.to_bytes(),
        "deep.gguf",
        &[
            "metadata key 'deep'",
            "nests arrays more than 8 levels deep",
        ],
    );

    let mut v = MetaValue::U8(1);
    for _ in 0..8 {
        v = MetaValue::Array(vec![v]);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("deep", v.clone());
    let g = GgufFile::from_bytes(w.to_bytes(), "deep-ok.gguf").unwrap();
    assert_eq!(g.get("deep"), Some(&v));
}

#[test]
fn unknown_tensor_type_id() {
    for id in [4u32, 5, 31, 40, u32::MAX] {
        let mut b = valid();
        let f = tensor_fields(&b, "blk.0.attn_norm.weight");
        put_u32(&mut b, f.ty, id);
        let (off, _) = expect_gguf_err(
            b,
            "type.gguf",
            &[&format!(
                "tensor 'blk.0.attn_norm.weight' has unknown ggml type id {id}"
            )],
        );
        assert_eq!(off, f.ty as u64);
    }
}

#[test]
fn unknown_metadata_value_type() {
    let mut b = valid();
    let at = kv_type_at(&b, "llama.block_count");
    put_u32(&mut b, at, 13);
    let (off, _) = expect_gguf_err(
        b,
        "mtype.gguf",
        &["metadata key 'llama.block_count' has unknown metadata value type 13"],
    );
    assert_eq!(off, at as u64);

    let mut b = valid();
    let at = kv_type_at(&b, "tokenizer.ggml.scores") + 4;
    put_u32(&mut b, at, 0xFFFF_FFFF);
    let (off, _) = expect_gguf_err(
        b,
        "etype.gguf",
        &["metadata key 'tokenizer.ggml.scores' is an array of unknown metadata value type 4294967295"],
    );
    assert_eq!(off, at as u64);
}

#[test]
fn bad_magic() {
    let mut b = valid();
    b[..4].copy_from_slice(b"GGML");
    expect_gguf_err(b, "magic.gguf", &["bad magic \"GGML\"", "not a GGUF file"]);
    let mut b = valid();
    b[..4].copy_from_slice(&[0x7f, b'E', b'L', b'F']);
    expect_gguf_err(b, "elf.gguf", &["bad magic (7f 45 4c 46)"]);
    expect_gguf_err(b"GG".to_vec(), "short.gguf", &["2 bytes long, too short"]);
    expect_gguf_err(Vec::new(), "empty.gguf", &["0 bytes long"]);
}

#[test]
fn version_1_and_others_refused() {
    let mut b = valid();
    put_u32(&mut b, 4, 1);
    let (off, _) = expect_gguf_err(b, "v1.gguf", &["GGUF version 1 is not supported"]);
    assert_eq!(off, 4);
    for (v, want) in [
        (0u32, "unsupported GGUF version 0"),
        (4, "unsupported GGUF version 4"),
        (0x0300_0000, "big-endian"),
    ] {
        let mut b = valid();
        put_u32(&mut b, 4, v);
        expect_gguf_err(b, "version.gguf", &[want]);
    }
    // Version 2 has the same layout and is accepted.
    let mut b = valid();
    put_u32(&mut b, 4, 2);
    assert_eq!(GgufFile::from_bytes(b, "v2").unwrap().version(), 2);
}

#[test]
fn bad_alignment() {
    for a in [0u32, 3, 48, 0x8000_0001] {
        let mut w = GgufWriter::new();
        w.set_alignment(a);
        let (off, _) = expect_gguf_err(
            w.to_bytes(),
            "align.gguf",
            &[&format!(
                "general.alignment is {a}: it must be a nonzero power of two"
            )],
        );
        assert_eq!(off, 24 + 8 + "general.alignment".len() as u64 + 4);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", MetaValue::U64(64));
    expect_gguf_err(
        w.to_bytes(),
        "align64.gguf",
        &["general.alignment must be a u32", "but is a u64"],
    );
}

#[test]
fn invalid_utf8() {
    let mut b = valid();
    let at = find(&b, b"hostile-fixture");
    b[at + 3] = 0xFF;
    expect_gguf_err(
        b,
        "utf8.gguf",
        &["metadata key 'general.name' is not valid UTF-8"],
    );
    let mut b = valid();
    let at = find(&b, "▁a".as_bytes());
    b[at] = 0xC0;
    expect_gguf_err(
        b,
        "utf8-arr.gguf",
        &["element 3 of metadata key 'tokenizer.ggml.tokens' is not valid UTF-8"],
    );
    let mut b = valid();
    let at = find(&b, b"output_norm.weight");
    b[at] = 0x80;
    expect_gguf_err(
        b,
        "utf8-name.gguf",
        &["name of tensor 3 is not valid UTF-8"],
    );
}

#[test]
fn duplicates_and_empty_names() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", MetaValue::U8(1));
    w.add_metadata("k", MetaValue::U8(2));
    expect_gguf_err(
        w.to_bytes(),
        "dupkey.gguf",
        &["duplicate metadata key 'k' (entries 0 and 1)"],
    );

    let mut w = GgufWriter::new();
    w.add_tensor("a", &[4], GgmlType::F32, vec![0; 16]);
    w.add_tensor("b", &[4], GgmlType::F32, vec![0; 16]);
    let mut b = w.to_bytes();
    let at = find(&b, &[1, 0, 0, 0, 0, 0, 0, 0, b'b']) + 8;
    b[at] = b'a';
    expect_gguf_err(
        b,
        "duptensor.gguf",
        &["duplicate tensor name 'a' (tensors 0 and 1)"],
    );

    let mut w = GgufWriter::new();
    w.add_metadata("", MetaValue::U8(1));
    expect_gguf_err(
        w.to_bytes(),
        "emptykey.gguf",
        &["metadata entry 0 has an empty key"],
    );
}

#[test]
fn bad_dimensions() {
    let mut b = valid();
    let f = tensor_fields(&b, "token_embd.weight");
    put_u32(&mut b, f.n_dims, 5);
    let (off, _) = expect_gguf_err(
        b,
        "ndims.gguf",
        &["tensor 'token_embd.weight' has 5 dimensions; ggml tensors have 1 to 4"],
    );
    assert_eq!(off, f.n_dims as u64);

    let mut b = valid();
    put_u32(&mut b, f.n_dims, 0);
    expect_gguf_err(b, "ndims0.gguf", &["has 0 dimensions"]);

    let mut b = valid();
    put_u64(&mut b, f.dims + 8, 0);
    let (off, _) = expect_gguf_err(
        b,
        "dim0.gguf",
        &["tensor 'token_embd.weight' dimension 1 is 0"],
    );
    assert_eq!(off, (f.dims + 8) as u64);

    let mut b = valid();
    put_u64(&mut b, f.dims, 33);
    expect_gguf_err(
        b,
        "block.gguf",
        &["tensor 'token_embd.weight' of type Q8_0 has rows of 33 elements, not a multiple of the Q8_0 block size 32"],
    );

    let mut b = valid();
    put_u64(&mut b, f.dims, 1 << 37);
    put_u64(&mut b, f.dims + 8, 1 << 30);
    expect_gguf_err(b, "elements.gguf", &["tensor 'token_embd.weight' shape [137438953472, 1073741824] has more than 2^63-1 elements"]);

    // A shape that fits i64 elements and usize bytes but lies far past the end of the file.
    let mut b = valid();
    put_u64(&mut b, f.dims, 1 << 40);
    expect_gguf_err(
        b,
        "huge.gguf",
        &["'token_embd.weight'", "extends past end of file"],
    );
}

#[test]
fn data_section_past_end() {
    // Cut the file right after the tensor-info table: the data section start lies beyond the end.
    let b = valid();
    let g = GgufFile::from_bytes(b.clone(), "x").unwrap();
    let cut = g.data_offset() as usize - 1;
    let (_, msg) = expect_gguf_err(
        b[..cut].to_vec(),
        "section.gguf",
        &["tensor data section would start at offset"],
    );
    assert!(msg.contains(&format!("file is only {cut} bytes")), "{msg}");
}

/// xorshift64* (Vigna): a deterministic pseudo-random stream with no dependency.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Everything a caller might do with a parsed file.
fn touch_everything(g: &GgufFile) -> u64 {
    let mut sum = 0u64;
    for t in g.tensors() {
        let d = g.tensor_data(t);
        assert_eq!(d.len(), t.n_bytes);
        sum = sum.wrapping_add(d.iter().map(|&x| u64::from(x)).sum::<u64>());
        assert!(g.tensor(&t.name).is_ok());
    }
    for (k, v) in g.metadata() {
        let _ = (
            g.get_u32(k),
            g.get_u64(k),
            g.get_f32(k),
            g.get_bool(k),
            g.get_str(k),
        );
        let _ = (g.get_str_array(k), g.get_f32_array(k), g.get_i32_array(k));
        sum = sum.wrapping_add(v.to_string().len() as u64);
    }
    sum
}

#[test]
fn random_corruption_never_panics() {
    let base = valid();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let extremes = [
        0u64,
        1,
        31,
        32,
        u64::MAX,
        u64::MAX / 2,
        1 << 32,
        1 << 40,
        i64::MAX as u64 + 1,
    ];
    let (mut ok, mut refused) = (0u32, 0u32);
    for i in 0..10_000 {
        let mut b = base.clone();
        match rng.below(4) {
            0 => {
                // Flip a few random bits.
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(b.len());
                    b[at] ^= 1 << rng.below(8);
                }
            }
            1 => {
                // Overwrite a random byte.
                let at = rng.below(b.len());
                b[at] = rng.next() as u8;
            }
            2 => {
                // Plant an extreme 64-bit value anywhere (hits counts, lengths, dims, offsets).
                let at = rng.below(b.len() - 8);
                let v = extremes[rng.below(extremes.len())];
                b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            _ => {
                // Truncate, sometimes after a flip.
                if rng.below(2) == 0 {
                    let at = rng.below(b.len());
                    b[at] ^= 1 << rng.below(8);
                }
                b.truncate(rng.below(b.len()));
            }
        }
        match GgufFile::from_bytes(b, "fuzz") {
            Ok(g) => {
                touch_everything(&g);
                ok += 1;
            }
            Err(Error::Gguf { path, .. }) => {
                assert_eq!(path, PathBuf::from("fuzz"), "iteration {i}");
                refused += 1;
            }
            Err(e) => panic!("iteration {i}: unexpected error kind {e:?}"),
        }
    }
    // Both outcomes must be exercised for the test to mean anything.
    assert!(ok > 100 && refused > 1000, "ok {ok}, refused {refused}");
}

/// Where the CI script puts the SmolLM2 model: `$LOCKSTEP_CACHE/models/` or
/// `~/.cache/lockstep/models/`.
fn smollm2_path() -> PathBuf {
    const FILE: &str = "smollm2-135m-q4_1.gguf";
    let mut tried = Vec::new();
    if let Some(cache) = std::env::var_os("LOCKSTEP_CACHE") {
        tried.push(PathBuf::from(cache).join("models").join(FILE));
    }
    if let Some(home) = std::env::var_os("HOME") {
        tried.push(
            PathBuf::from(home)
                .join(".cache/lockstep/models")
                .join(FILE),
        );
    }
    tried
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| panic!("{FILE} not found (looked at {tried:?}); fetch the model first"))
}

#[test]
#[ignore = "needs the SmolLM2-135M Q4_1 model in $LOCKSTEP_CACHE/models or ~/.cache/lockstep/models; CI runs it with --ignored after fetching"]
fn real_model_smollm2_parses() {
    let path = smollm2_path();
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.path(), path);
    assert!(g.version() == 2 || g.version() == 3);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");

    let count = |ty| g.tensors().iter().filter(|t| t.ggml_type == ty).count();
    assert_eq!(g.tensors().len(), 272);
    assert_eq!(count(GgmlType::Q4_1), 210);
    assert_eq!(count(GgmlType::F32), 61);
    assert_eq!(count(GgmlType::Q8_0), 1);

    let embd = g.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    let n_embd = g.get_u32("llama.embedding_length").unwrap();
    let n_layer = g.get_u32("llama.block_count").unwrap();
    let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(embd.dims, vec![u64::from(n_embd), tokens.len() as u64]);
    assert_eq!(
        g.tensors()
            .iter()
            .filter(|t| t.name.starts_with("blk."))
            .count(),
        9 * n_layer as usize
    );
    assert!(g.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap() > 0.0);

    // Every tensor's bytes lie inside the map, aligned, in table order without overlap.
    let mut end = g.data_offset();
    for t in g.tensors() {
        assert_eq!(g.tensor_data(t).len(), t.n_bytes, "{}", t.name);
        assert_eq!(t.offset % g.alignment(), 0, "{}", t.name);
        assert!(t.offset >= end, "{}", t.name);
        end = t.offset + t.n_bytes as u64;
    }
    assert!(end <= g.file_size());
    eprintln!(
        "{}: GGUF v{}, {} metadata keys, {} tensors, vocab {}, data at {}, {} bytes",
        path.display(),
        g.version(),
        g.metadata().len(),
        g.tensors().len(),
        tokens.len(),
        g.data_offset(),
        g.file_size()
    );
}
