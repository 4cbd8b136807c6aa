//! Round trips GgufWriter -> GgufFile, and the typed getters. Hostile inputs are in
//! engine/tests/gguf_hostile.rs.

use super::*;

/// Deterministic filler bytes for tensor data.
fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn every_type() -> Vec<(&'static str, MetaValue)> {
    vec![
        ("t.u8", MetaValue::U8(200)),
        ("t.i8", MetaValue::I8(-100)),
        ("t.u16", MetaValue::U16(65_000)),
        ("t.i16", MetaValue::I16(-32_000)),
        ("t.u32", MetaValue::U32(4_000_000_000)),
        ("t.i32", MetaValue::I32(-2_000_000_000)),
        ("t.f32", MetaValue::F32(1.0e-5)),
        ("t.bool", MetaValue::Bool(true)),
        ("t.bool_false", MetaValue::Bool(false)),
        (
            "t.string",
            MetaValue::String("héllo ▁world \u{1F600}".into()),
        ),
        ("t.empty_string", MetaValue::String(String::new())),
        ("t.u64", MetaValue::U64(u64::MAX)),
        ("t.i64", MetaValue::I64(i64::MIN)),
        ("t.f64", MetaValue::F64(std::f64::consts::PI)),
        (
            "t.str_array",
            MetaValue::Array(vec![
                MetaValue::String("<s>".into()),
                MetaValue::String("</s>".into()),
                MetaValue::String("".into()),
            ]),
        ),
        (
            "t.f32_array",
            MetaValue::Array(vec![MetaValue::F32(0.5), MetaValue::F32(-2.0)]),
        ),
        (
            "t.i32_array",
            MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(-3)]),
        ),
        (
            "t.u8_array",
            MetaValue::Array(vec![MetaValue::U8(1), MetaValue::U8(2)]),
        ),
        ("t.empty_array", MetaValue::Array(vec![])),
        (
            "t.nested",
            MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::U32(1), MetaValue::U32(2)]),
                MetaValue::Array(vec![MetaValue::String("x".into())]),
                MetaValue::Array(vec![]),
                MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::F64(-0.25)])]),
            ]),
        ),
    ]
}

/// (name, dims, type, data) of one tensor in [`sample`].
type SampleTensor = (&'static str, Vec<u64>, GgmlType, Vec<u8>);

/// A small file with every metadata type and tensors of several types.
fn sample(version: u32, alignment: Option<u32>) -> (Vec<u8>, Vec<SampleTensor>) {
    let mut w = GgufWriter::new();
    w.set_version(version);
    if let Some(a) = alignment {
        w.set_alignment(a);
    }
    w.add_metadata("general.architecture", MetaValue::String("llama".into()));
    for (k, v) in every_type() {
        w.add_metadata(k, v);
    }
    let tensors = vec![
        (
            "token_embd.weight",
            vec![64, 3],
            GgmlType::Q8_0,
            bytes(2 * 3 * 34, 1),
        ),
        (
            "blk.0.attn_norm.weight",
            vec![64],
            GgmlType::F32,
            bytes(64 * 4, 2),
        ),
        (
            "blk.0.attn_q.weight",
            vec![64, 2],
            GgmlType::Q4_1,
            bytes(2 * 2 * 20, 3),
        ),
        (
            "blk.0.ffn_up.weight",
            vec![256, 1, 1, 2],
            GgmlType::Q4_K,
            bytes(2 * 144, 4),
        ),
        (
            "blk.0.ffn_down.weight",
            vec![3, 5],
            GgmlType::F16,
            bytes(15 * 2, 5),
        ),
        ("output.weight", vec![7], GgmlType::BF16, bytes(14, 6)),
    ];
    for (name, dims, ty, data) in &tensors {
        w.add_tensor(name, dims, *ty, data.clone());
    }
    (w.to_bytes(), tensors)
}

#[test]
fn round_trip_metadata_and_tensors() {
    for (version, alignment) in [
        (3, None),
        (2, None),
        (3, Some(64)),
        (3, Some(1)),
        (2, Some(4096)),
    ] {
        let (file, tensors) = sample(version, alignment);
        let g = GgufFile::from_bytes(file.clone(), "sample").unwrap();
        let align = u64::from(alignment.unwrap_or(32));
        assert_eq!(g.version(), version);
        assert_eq!(g.alignment(), align);
        assert_eq!(g.data_offset() % align, 0);
        assert_eq!(g.path(), Path::new("sample"));
        assert_eq!(g.file_size(), file.len() as u64);

        // Metadata: same keys, values and order (general.alignment comes first when set).
        let mut expected: Vec<(String, MetaValue)> = Vec::new();
        if let Some(a) = alignment {
            expected.push(("general.alignment".into(), MetaValue::U32(a)));
        }
        expected.push((
            "general.architecture".into(),
            MetaValue::String("llama".into()),
        ));
        expected.extend(every_type().into_iter().map(|(k, v)| (k.to_string(), v)));
        assert_eq!(g.metadata(), &expected[..]);
        for (k, v) in &expected {
            assert_eq!(g.get(k), Some(v), "{k}");
        }
        assert_eq!(g.get("missing"), None);

        // Tensors: table order, shapes, types, sizes and bytes.
        assert_eq!(g.tensors().len(), tensors.len());
        for (t, (name, dims, ty, data)) in g.tensors().iter().zip(&tensors) {
            assert_eq!(t.name, *name);
            assert_eq!(&t.dims, dims);
            assert_eq!(t.ggml_type, *ty);
            assert_eq!(t.n_elements, dims.iter().product::<u64>());
            assert_eq!(t.n_bytes, data.len());
            assert_eq!(t.offset % align, 0);
            assert!(t.offset >= g.data_offset());
            assert_eq!(g.tensor_data(t), &data[..], "{name}");
            assert_eq!(g.tensor(name).unwrap(), t);
            assert_eq!(g.tensor_bytes(name).unwrap(), &data[..]);
        }
    }
}

#[test]
fn writer_output_is_stable_and_packed() {
    let (file, _) = sample(3, None);
    let (again, _) = sample(3, None);
    assert_eq!(file, again);
    assert_eq!(&file[..4], b"GGUF");
    assert_eq!(
        file.len() % 32,
        0,
        "the last tensor is padded too, as llama.cpp writes it"
    );
    let g = GgufFile::from_bytes(file, "packed").unwrap();
    // Offsets are packed in table order with padding between (llama.cpp's layout).
    let mut expect = g.data_offset();
    for t in g.tensors() {
        assert_eq!(t.offset, expect, "{}", t.name);
        expect = parse::align_up(t.offset + t.n_bytes as u64, 32).unwrap();
    }
}

#[test]
fn empty_file_has_no_tensors_and_no_metadata() {
    let g = GgufFile::from_bytes(GgufWriter::new().to_bytes(), "empty").unwrap();
    assert_eq!(g.version(), 3);
    assert!(g.metadata().is_empty());
    assert!(g.tensors().is_empty());
    assert_eq!(g.data_offset(), 32);
}

#[test]
fn tensor_helpers() {
    let (file, _) = sample(3, None);
    let g = GgufFile::from_bytes(file, "helpers").unwrap();
    let q = g.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.row_len(), q.n_rows(), q.row_bytes()), (64, 2, 40));
    let up = g.tensor("blk.0.ffn_up.weight").unwrap();
    assert_eq!((up.row_len(), up.n_rows(), up.row_bytes()), (256, 2, 144));
    let err = g.tensor("nope.weight").unwrap_err().to_string();
    assert!(
        err.contains("helpers") && err.contains("tensor 'nope.weight' not found"),
        "{err}"
    );
}

#[test]
fn tensor_data_of_foreign_info_is_empty_not_a_panic() {
    let (file, _) = sample(3, None);
    let g = GgufFile::from_bytes(file, "a").unwrap();
    let mut t = g.tensors()[0].clone();
    t.offset = u64::MAX - 3;
    assert!(g.tensor_data(&t).is_empty());
    t.offset = g.file_size() - 1;
    assert!(g.tensor_data(&t).is_empty());
}

fn getters_file() -> GgufFile {
    let mut w = GgufWriter::new();
    w.add_metadata("u8", MetaValue::U8(7));
    w.add_metadata("i32", MetaValue::I32(12));
    w.add_metadata("neg", MetaValue::I32(-1));
    w.add_metadata("big", MetaValue::U64(1 << 40));
    w.add_metadata("f32", MetaValue::F32(0.5));
    w.add_metadata("f64", MetaValue::F64(1e-6));
    w.add_metadata("f64_huge", MetaValue::F64(1e300));
    w.add_metadata("flag", MetaValue::Bool(true));
    w.add_metadata("name", MetaValue::String("llama".into()));
    w.add_metadata(
        "toks",
        MetaValue::Array(vec![
            MetaValue::String("a".into()),
            MetaValue::String("b".into()),
        ]),
    );
    w.add_metadata(
        "scores",
        MetaValue::Array(vec![MetaValue::F32(-1.5), MetaValue::F32(2.0)]),
    );
    w.add_metadata("scores64", MetaValue::Array(vec![MetaValue::F64(0.25)]));
    w.add_metadata(
        "types_u8",
        MetaValue::Array(vec![MetaValue::U8(1), MetaValue::U8(6)]),
    );
    w.add_metadata(
        "types_i64",
        MetaValue::Array(vec![MetaValue::I64(-4), MetaValue::I64(1 << 40)]),
    );
    GgufFile::from_bytes(w.to_bytes(), "getters.gguf").unwrap()
}

#[test]
fn typed_getters_accept_compatible_types() {
    let g = getters_file();
    assert_eq!(g.get_u32("u8").unwrap(), 7);
    assert_eq!(g.get_u32("i32").unwrap(), 12);
    assert_eq!(g.get_u64("big").unwrap(), 1 << 40);
    assert_eq!(g.get_u64("i32").unwrap(), 12);
    assert_eq!(g.get_f32("f32").unwrap(), 0.5);
    assert_eq!(g.get_f32("f64").unwrap(), 1e-6);
    assert!(g.get_bool("flag").unwrap());
    assert_eq!(g.get_str("name").unwrap(), "llama");
    assert_eq!(g.get_str_array("toks").unwrap(), vec!["a", "b"]);
    assert_eq!(g.get_f32_array("scores").unwrap(), vec![-1.5, 2.0]);
    assert_eq!(g.get_f32_array("scores64").unwrap(), vec![0.25]);
    assert_eq!(g.get_i32_array("types_u8").unwrap(), vec![1, 6]);
    assert_eq!(g.get_array("toks").unwrap().len(), 2);
}

#[test]
fn typed_getters_name_file_key_and_found_type() {
    let g = getters_file();
    let cases: Vec<(Result<()>, &str)> = vec![
        (
            g.get_u32("absent").map(drop),
            "metadata key 'absent' not found",
        ),
        (
            g.get_u32("neg").map(drop),
            "metadata key 'neg' = -1 (i32) does not fit in u32",
        ),
        (g.get_u32("big").map(drop), "does not fit in u32"),
        (g.get_u64("neg").map(drop), "does not fit in u64"),
        (
            g.get_u32("name").map(drop),
            "metadata key 'name' is string, expected an integer (u32)",
        ),
        (g.get_u32("f32").map(drop), "is f32, expected an integer"),
        (
            g.get_f32("i32").map(drop),
            "metadata key 'i32' is i32, expected a float",
        ),
        (g.get_f32("f64_huge").map(drop), "does not fit in f32"),
        (
            g.get_bool("u8").map(drop),
            "metadata key 'u8' is u8, expected bool",
        ),
        (
            g.get_str("toks").map(drop),
            "metadata key 'toks' is array of 2 string, expected string",
        ),
        (
            g.get_str_array("name").map(drop),
            "is string, expected an array",
        ),
        (
            g.get_str_array("scores").map(drop),
            "'scores' element 0 is f32 (-1.5), expected string",
        ),
        (
            g.get_f32_array("toks").map(drop),
            "element 0 is string (\"a\"), expected f32 or f64",
        ),
        (
            g.get_i32_array("types_i64").map(drop),
            "element 1 is i64 (1099511627776)",
        ),
        (
            g.get_i32_array("scores").map(drop),
            "expected an integer that fits in i32",
        ),
    ];
    for (r, want) in cases {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::Model { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.starts_with("getters.gguf: "), "{msg}");
        assert!(msg.contains(want), "{msg:?} should contain {want:?}");
    }
}

#[test]
fn meta_value_helpers() {
    assert_eq!(MetaValue::I8(-1).as_u64(), None);
    assert_eq!(MetaValue::I8(-1).as_i64(), Some(-1));
    assert_eq!(MetaValue::U64(u64::MAX).as_i64(), None);
    assert_eq!(MetaValue::U64(u64::MAX).as_u64(), Some(u64::MAX));
    assert_eq!(MetaValue::F32(1.5).as_f64(), Some(1.5));
    assert_eq!(MetaValue::F32(1.5).as_u64(), None);
    assert_eq!(MetaValue::Bool(true).as_u64(), None);
    assert_eq!(MetaValue::String("s".into()).as_str(), Some("s"));
    let names: Vec<&str> = every_type().iter().map(|(_, v)| v.type_name()).collect();
    assert!(names.contains(&"string") && names.contains(&"array") && names.contains(&"f64"));
    let long = MetaValue::Array((0..10).map(MetaValue::U32).collect());
    assert_eq!(long.to_string(), "[0, 1, 2, 3, 4, 5, 6, 7, … (10 total)]");
    assert_eq!(long.describe(), "array of 10 u32");
    assert_eq!(MetaValue::Array(vec![]).describe(), "empty array");
}

#[test]
#[should_panic(expected = "array mixes u32 (element 0) and string (element 1)")]
fn writer_refuses_mixed_arrays() {
    GgufWriter::new().add_metadata(
        "bad",
        MetaValue::Array(vec![MetaValue::U32(1), MetaValue::String("x".into())]),
    );
}

#[test]
#[should_panic(expected = "needs 40 bytes")]
fn writer_refuses_wrong_tensor_size() {
    GgufWriter::new().add_tensor("t", &[64], GgmlType::Q4_1, vec![0; 39]);
}

#[test]
fn open_maps_a_file_and_reports_io_errors_with_the_path() {
    let (file, tensors) = sample(3, None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, &file).unwrap();
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.path(), path);
    let (name, _, _, data) = &tensors[2];
    assert_eq!(g.tensor_bytes(name).unwrap(), &data[..]);
    assert!(format!("{g:?}").contains("n_tensors: 6"));

    let missing = dir.path().join("missing.gguf");
    let e = GgufFile::open(&missing).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("missing.gguf"), "{e}");

    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let e = GgufFile::open(&empty).unwrap_err().to_string();
    assert!(e.contains("empty.gguf") && e.contains("too short"), "{e}");
}

#[test]
fn gguf_file_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GgufFile>();
    assert_send_sync::<TensorInfo>();
    assert_send_sync::<MetaValue>();
}

#[test]
fn type_counts_and_bits_per_weight_follow_the_tensor_table() {
    let cfg = crate::synth::SynthModel::default();
    let g = GgufFile::from_bytes(cfg.build().unwrap(), "tiny").unwrap();
    let (d, ff, l) = (cfg.d_model as u64, cfg.d_ff as u64, cfg.n_layer as u64);
    let kv = d / cfg.n_head as u64 * cfg.n_kv_head as u64;
    let vocab = g.tensor("token_embd.weight").unwrap().n_rows();
    // per layer: q, o (d×d), k, v (kv×d), gate, up, down (ff×d): Q4_1; token_embd: Q8_0; norms: F32
    let q4_1 = l * (2 * d * d + 2 * kv * d + 3 * ff * d);
    let f32s = (2 * l + 1) * d;
    let want = [
        (GgmlType::Q4_1, 7 * l as usize, q4_1, q4_1 / 32 * 20),
        (GgmlType::Q8_0, 1, vocab * d, vocab * d / 32 * 34),
        (GgmlType::F32, 2 * l as usize + 1, f32s, 4 * f32s),
    ];
    let mut want: Vec<TypeCount> = want
        .into_iter()
        .map(|(ggml_type, tensors, elements, bytes)| TypeCount {
            ggml_type,
            tensors,
            elements,
            bytes,
        })
        .collect();
    want.sort_by_key(|c| std::cmp::Reverse(c.elements));
    assert_eq!(g.type_counts(), want);
    let bits: u64 = want.iter().map(|c| 8 * c.bytes).sum();
    let elements: u64 = want.iter().map(|c| c.elements).sum();
    assert_eq!(g.bits_per_weight(), Some(bits as f64 / elements as f64));
}
