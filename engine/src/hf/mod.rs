//! Hugging Face checkpoints: a directory with `config.json`, `model.safetensors` (or shards listed by
//! `model.safetensors.index.json`) and `tokenizer.json`, presented to the engine as a [`GgufFile`]: GGUF
//! metadata keys made from `config.json` and `tokenizer.json`, GGUF tensor names over the memory-mapped
//! safetensors bytes. The architecture loaders ([`crate::models::ARCHITECTURES`]) run unchanged on it.
//!
//! Where the two layouts differ ([`layout`]: Q/K RoPE rows, Gemma's norm `w - 1`, GPT-2's Conv1D, Gemma 4's
//! `rope_freqs`), the tensor is a derived copy in memory, listed in [`crate::gguf::HfSource::derived`];
//! every other tensor is read in place from the map (F32, F16, BF16 as stored). The same tables give the
//! other direction ([`export`]: `lockstep export-hf`).

pub mod export;
pub mod layout;
pub mod tokenizer_json;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::gguf::{GgufFile, HfSource, MetaValue, Part, PartData, TensorInfo};
use crate::quant::GgmlType;
use crate::{Error, Result};
use layout::{ArchLayout, Cfg, Heads, Transform};

/// The files of an HF directory the engine reads.
pub const CONFIG: &str = "config.json";
/// The single-file weights.
pub const WEIGHTS: &str = "model.safetensors";
/// The index of sharded weights (`weight_map`: tensor name → shard file).
pub const INDEX: &str = "model.safetensors.index.json";
/// The tokenizer.
pub const TOKENIZER: &str = "tokenizer.json";

/// Whether `path` is a directory (taken as an HF checkpoint by [`open`]).
pub fn is_hf_dir(path: &Path) -> bool {
    path.is_dir()
}

/// Open a model: a Hugging Face checkpoint directory ([`open_dir`]) or a GGUF file ([`GgufFile::open`]).
///
/// Errors: as those.
pub fn open(path: &Path) -> Result<GgufFile> {
    if is_hf_dir(path) {
        open_dir(path)
    } else {
        GgufFile::open(path)
    }
}

fn model_err(path: &Path, what: impl Into<String>) -> Error {
    Error::Model {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// Read and parse a JSON file; errors name the file.
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| model_err(path, format!("not valid JSON: {e}")))
}

/// The value at dotted `path` of a JSON object (`None` if absent).
pub(crate) fn get_path<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// Set the value at dotted `path`, creating objects on the way.
pub(crate) fn set_path(v: &mut Value, path: &str, value: Value) {
    let mut cur = v;
    let parts: Vec<&str> = path.split('.').collect();
    for k in &parts[..parts.len() - 1] {
        if !cur.get(*k).is_some_and(Value::is_object) {
            cur[*k] = Value::Object(Default::default());
        }
        cur = &mut cur[*k];
    }
    cur[parts[parts.len() - 1]] = value;
}

/// The GGUF key of a rule's key: `<arch>.<k>`, or `k` itself for `tokenizer.*`.
pub(crate) fn full_key(arch: &str, k: &str) -> String {
    if k.starts_with("tokenizer.") {
        k.to_string()
    } else {
        format!("{arch}.{k}")
    }
}

/// The config of an HF directory as GGUF metadata, by the architecture's [`layout::Cfg`] table. `tensors`
/// are the HF tensor names present (Gemma 4's V = K layers). Returns the metadata and any tensor the config
/// implies (Gemma 4's `rope_freqs`: GGUF name, f32 values).
/// GGUF metadata entries (key, value).
type Meta = Vec<(String, MetaValue)>;

/// Tensors made from the config (GGUF name, f32 values).
type MadeTensors = Vec<(String, Vec<f32>)>;

fn meta_from_config(l: &ArchLayout, cfg: &Value, cfg_path: &Path) -> Result<(Meta, MadeTensors)> {
    let bad = |what: String| model_err(cfg_path, what);
    let mut meta: Vec<(String, MetaValue)> = Vec::new();
    let mut extra = Vec::new();
    let a = l.arch;
    let get = |k: &str| get_path(cfg, k).filter(|v| !v.is_null());
    let u32_of = |k: &str| -> Result<Option<u32>> {
        match get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| bad(format!("{k} = {v}: expected a non-negative integer"))),
        }
    };
    let f32_of = |k: &str| -> Result<Option<f32>> {
        match get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| bad(format!("{k} = {v}: expected a number"))),
        }
    };
    let need_u32 = |k: &str| u32_of(k)?.ok_or_else(|| bad(format!("{k} is missing")));
    let need_f32 = |k: &str| f32_of(k)?.ok_or_else(|| bad(format!("{k} is missing")));
    // the head width the config implies (HeadDim's field, else hidden / heads)
    let head_dim = || -> Result<u32> {
        for r in l.config {
            if let Cfg::HeadDim(f) = r {
                if let Some(h) = u32_of(f)? {
                    return Ok(h);
                }
            }
        }
        let (d, h) = match l.arch {
            "gpt2" => (need_u32("n_embd")?, need_u32("n_head")?),
            _ => (need_u32("hidden_size")?, need_u32("num_attention_heads")?),
        };
        if h == 0 || d % h != 0 {
            return Err(bad(format!(
                "{d} wide over {h} heads: not a whole head width"
            )));
        }
        Ok(d / h)
    };
    let layer_types = || -> Result<Vec<bool>> {
        let v = get("layer_types")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("layer_types is missing or not a list".into()))?;
        v.iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(bad(format!(
                    "layer_types: {t} is neither sliding_attention nor full_attention"
                ))),
            })
            .collect()
    };
    let mut put = |k: String, v: MetaValue| meta.push((k, v));
    for r in l.config {
        match *r {
            Cfg::U32(g, h) => put(full_key(a, g), MetaValue::U32(need_u32(h)?)),
            Cfg::U32Opt(g, h) => {
                if let Some(x) = u32_of(h)? {
                    put(full_key(a, g), MetaValue::U32(x))
                }
            }
            Cfg::U32Or(g, h, _) => put(full_key(a, g), MetaValue::U32(need_u32(h)?)),
            Cfg::F32(g, h) => put(full_key(a, g), MetaValue::F32(need_f32(h)?)),
            Cfg::F32Or(g, h, _) => {
                if let Some(x) = f32_of(h)? {
                    put(full_key(a, g), MetaValue::F32(x))
                }
            }
            Cfg::Const(h, want) => {
                let want: Value = serde_json::from_str(want).expect("layout constants are JSON");
                if let Some(have) = get_path(cfg, h) {
                    if *have != want {
                        return Err(bad(format!(
                            "{h} = {have}: lockstep's {a} implements {want} only"
                        )));
                    }
                }
            }
            Cfg::MetaBool(g, v) => put(full_key(a, g), MetaValue::Bool(v)),
            Cfg::MetaF32(g, v) => put(full_key(a, g), MetaValue::F32(v)),
            Cfg::Ignored(..) => {}
            Cfg::HeadDim(_) => {
                let h = head_dim()?;
                put(full_key(a, "attention.key_length"), MetaValue::U32(h));
                put(full_key(a, "attention.value_length"), MetaValue::U32(h));
            }
            Cfg::EqualsHeadDim(h) => {
                let hd = head_dim()?;
                if let Some(x) = f32_of(h)? {
                    if x != hd as f32 {
                        return Err(bad(format!(
                            "{h} = {x}: lockstep's {a} scales Q by 1/sqrt(head_dim {hd}) (llama.cpp's), so it must equal head_dim"
                        )));
                    }
                }
            }
            Cfg::RopeDims(factor) => {
                let hd = head_dim()?;
                let f = match factor {
                    Some(k) => f32_of(k)?.unwrap_or(1.0),
                    None => 1.0,
                };
                let n = (hd as f32 * f).round() as u32;
                if (n as f32 - hd as f32 * f).abs() > 1e-3 || n == 0 || !n.is_multiple_of(2) {
                    return Err(bad(format!(
                        "partial_rotary_factor {f} of head_dim {hd} is not a whole, even number of dims"
                    )));
                }
                put(full_key(a, "rope.dimension_count"), MetaValue::U32(n));
            }
            Cfg::SwaPattern(n) => {
                let have = layer_types()?;
                let want: Vec<bool> = (0..have.len() as u32)
                    .map(|il| n == 0 || il % n < n - 1)
                    .collect();
                if have != want {
                    return Err(bad(format!(
                        "layer_types {have:?} (true = sliding) differ from llama.cpp's {a} pattern {want:?} (every {n}th layer global), the one lockstep implements"
                    )));
                }
            }
            Cfg::Gemma4 => {
                let types = layer_types()?;
                let hd_swa = head_dim()?;
                let mut hd_full = None;
                for (il, &sliding) in types.iter().enumerate() {
                    if sliding {
                        continue;
                    }
                    let h = u32_of(&format!("per_layer_config.{il}.head_dim"))?
                        .or(u32_of("global_head_dim")?)
                        .unwrap_or(hd_swa);
                    if hd_full.is_some_and(|x| x != h) {
                        return Err(bad(format!(
                            "full-attention layers with head widths {} and {h}: lockstep's gemma4 has one",
                            hd_full.unwrap_or(0)
                        )));
                    }
                    hd_full = Some(h);
                }
                let hd_full = hd_full.unwrap_or(hd_swa);
                put(
                    full_key(a, "attention.sliding_window_pattern"),
                    MetaValue::Array(types.iter().map(|&s| MetaValue::Bool(s)).collect()),
                );
                for (k, v) in [
                    ("attention.key_length", hd_full),
                    ("attention.value_length", hd_full),
                    ("attention.key_length_swa", hd_swa),
                    ("attention.value_length_swa", hd_swa),
                    ("rope.dimension_count", hd_full),
                    ("rope.dimension_count_swa", hd_swa),
                ] {
                    put(full_key(a, k), MetaValue::U32(v));
                }
                let rp = "rope_parameters";
                if get(&format!("{rp}.sliding_attention.rope_type")).and_then(Value::as_str)
                    != Some("default")
                {
                    return Err(bad(format!(
                        "{rp}.sliding_attention.rope_type must be \"default\""
                    )));
                }
                put(
                    full_key(a, "rope.freq_base_swa"),
                    MetaValue::F32(need_f32(&format!("{rp}.sliding_attention.rope_theta"))?),
                );
                put(
                    full_key(a, "rope.freq_base"),
                    MetaValue::F32(need_f32(&format!("{rp}.full_attention.rope_theta"))?),
                );
                match get(&format!("{rp}.full_attention.rope_type")).and_then(Value::as_str) {
                    Some("default") => {}
                    Some("proportional") => {
                        // Gemma4Model.generate_extra_tensors: [1] * n_rot + [1e30] * the rest
                        let f = f32_of(&format!("{rp}.full_attention.partial_rotary_factor"))?.unwrap_or(1.0);
                        let pairs = hd_full / 2;
                        let n = (f * pairs as f32).round() as u32;
                        if (n as f32 - f * pairs as f32).abs() > 1e-3 {
                            return Err(bad(format!(
                                "{rp}.full_attention.partial_rotary_factor {f} of {pairs} RoPE pairs is not a whole number"
                            )));
                        }
                        let ff = (0..pairs).map(|i| if i < n { 1.0 } else { 1e30 }).collect();
                        extra.push(("rope_freqs.weight".to_string(), ff));
                    }
                    other => {
                        return Err(bad(format!(
                            "{rp}.full_attention.rope_type {other:?}: lockstep's gemma4 implements default and proportional"
                        )))
                    }
                }
            }
        }
    }
    Ok((meta, extra))
}

/// The HF tensor files of `dir`: the shards of `model.safetensors.index.json` (with its weight map), or
/// `model.safetensors`.
/// An index's `weight_map`: HF tensor name → shard file name.
type WeightMap = BTreeMap<String, String>;

fn weight_files(dir: &Path) -> Result<(Vec<PathBuf>, Option<WeightMap>)> {
    let index = dir.join(INDEX);
    if index.exists() {
        let v = read_json(&index)?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| model_err(&index, "no \"weight_map\" object"))?;
        let mut wm = BTreeMap::new();
        for (k, f) in map {
            let f = f
                .as_str()
                .filter(|f| !f.contains('/') && !f.contains('\\') && f.ends_with(".safetensors"))
                .ok_or_else(|| {
                    model_err(&index, format!("weight_map[{k:?}] = {f}: not a *.safetensors file name in this directory"))
                })?;
            wm.insert(k.clone(), f.to_string());
        }
        if wm.is_empty() {
            return Err(model_err(&index, "weight_map is empty"));
        }
        let mut files: Vec<String> = wm.values().cloned().collect();
        files.sort();
        files.dedup();
        if let Some(f) = files.iter().find(|f| !dir.join(f).is_file()) {
            return Err(model_err(
                &index,
                format!("weight_map names {f}, which does not exist"),
            ));
        }
        Ok((files.iter().map(|f| dir.join(f)).collect(), Some(wm)))
    } else {
        let w = dir.join(WEIGHTS);
        if !w.exists() {
            return Err(model_err(
                dir,
                format!("neither {WEIGHTS} nor {INDEX}: not a Hugging Face checkpoint directory"),
            ));
        }
        Ok((vec![w], None))
    }
}

fn ggml_type_of(d: safetensors::Dtype) -> Option<GgmlType> {
    match d {
        safetensors::Dtype::F32 => Some(GgmlType::F32),
        safetensors::Dtype::F16 => Some(GgmlType::F16),
        safetensors::Dtype::BF16 => Some(GgmlType::BF16),
        _ => None,
    }
}

/// Element `i` of F32/F16/BF16 bytes as f32.
pub(crate) fn elem_f32(ty: GgmlType, b: &[u8], i: usize) -> f32 {
    match ty {
        GgmlType::F32 => f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes")),
        GgmlType::F16 => half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32(),
        _ => half::bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32(),
    }
}

/// Reorder the rows of a `[rows, row_bytes]` buffer: output row `g` is input row `src[g]`.
pub(crate) fn permute_rows(bytes: &[u8], row_bytes: usize, src: &[usize]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &s in src {
        out.extend_from_slice(&bytes[s * row_bytes..(s + 1) * row_bytes]);
    }
    out
}

/// Transpose a `[rows, cols]` matrix of `es`-byte elements.
pub(crate) fn transpose(bytes: &[u8], rows: usize, cols: usize, es: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * cols + c) * es, (c * rows + r) * es);
            out[to..to + es].copy_from_slice(&bytes[from..from + es]);
        }
    }
    out
}

/// Open the HF checkpoint directory `dir` as a [`GgufFile`] (see the module docs).
///
/// Errors ([`Error::Model`] / [`Error::Io`] naming the file and the problem): a missing or invalid
/// `config.json`, a `model_type` lockstep has no layout for, a config value lockstep does not implement; no
/// weights, a truncated or malformed safetensors file, a bad index (a shard outside the directory, a tensor
/// the index places in a shard that lacks it), a tensor with no place in the architecture, of a dtype other
/// than F32/F16/BF16, or of a shape the layout cannot take, a required tensor missing; a missing or
/// unsupported `tokenizer.json`.
pub fn open_dir(dir: &Path) -> Result<GgufFile> {
    let cfg_path = dir.join(CONFIG);
    if !cfg_path.exists() {
        return Err(model_err(
            dir,
            format!("no {CONFIG}: not a Hugging Face checkpoint directory"),
        ));
    }
    let cfg = read_json(&cfg_path)?;
    let model_type = cfg
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| model_err(&cfg_path, "no \"model_type\""))?;
    let l = layout::layout_of_model_type(model_type).ok_or_else(|| {
        Error::Unsupported(format!(
            "{}: model_type {model_type:?} is not one lockstep's engine implements (known: {})",
            cfg_path.display(),
            layout::LAYOUTS
                .iter()
                .map(|l| l.model_type)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let (mut meta, extra) = meta_from_config(l, &cfg, &cfg_path)?;
    let arch = l.arch;
    meta.insert(
        0,
        (
            "general.architecture".into(),
            MetaValue::String(arch.into()),
        ),
    );
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    meta.insert(1, ("general.name".into(), MetaValue::String(name)));
    let meta_u32 = |k: &str| {
        meta.iter()
            .find(|(key, _)| key == &full_key(arch, k))
            .and_then(|(_, v)| v.as_i128())
            .map(|x| x as usize)
    };
    let n_layer = meta_u32("block_count").unwrap_or(0);
    // an encoder–decoder's encoder stack (`enc.blk.{N}`) counts its own blocks
    let n_enc_layer = meta_u32("encoder.block_count").unwrap_or(0);
    let layers_of = |gguf: &str| {
        if gguf.starts_with("enc.") {
            n_enc_layer
        } else {
            n_layer
        }
    };
    let n_head = meta_u32("attention.head_count").unwrap_or(0);
    let n_head_kv = meta_u32("attention.head_count_kv").unwrap_or(n_head);

    let (files, index) = weight_files(dir)?;
    let mut parts: Vec<Part> = Vec::new();
    let mut tensors: Vec<TensorInfo> = Vec::new();
    let mut derived: Vec<(String, usize, String)> = Vec::new();
    let mut owned: Vec<Vec<u8>> = Vec::new();
    let mut base = 0u64;
    let mut mapped_bytes = 0u64;
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    for f in &files {
        let file = File::open(f).map_err(|source| Error::Io {
            path: f.clone(),
            source,
        })?;
        let len = file
            .metadata()
            .map_err(|source| Error::Io {
                path: f.clone(),
                source,
            })?
            .len();
        if len < 8 {
            return Err(model_err(
                f,
                format!("{len} bytes: too short for a safetensors file (truncated?)"),
            ));
        }
        // SAFETY: read-only private map; the model files are not modified while in use (as GgufFile::open).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| Error::Io {
            path: f.clone(),
            source,
        })?;
        let (n, st) = safetensors::SafeTensors::read_metadata(&map).map_err(|e| {
            model_err(
                f,
                format!("not a valid safetensors file ({e:?}): truncated or malformed"),
            )
        })?;
        let data_start = 8 + n as u64;
        let mut names: Vec<(String, safetensors::tensor::TensorInfo)> = st
            .tensors()
            .into_iter()
            .map(|(k, v)| (k, v.clone()))
            .collect();
        names.sort_by_key(|(_, v)| v.data_offsets.0);
        let fname = f
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        for (hf_name, info) in names {
            if let Some(wm) = &index {
                if wm.get(&hf_name).map(String::as_str) != Some(fname.as_str()) {
                    return Err(model_err(
                        &dir.join(INDEX),
                        format!(
                            "tensor {hf_name} is in {fname} but the weight_map says {:?}",
                            wm.get(&hf_name)
                        ),
                    ));
                }
            }
            if let Some(prev) = seen.insert(hf_name.clone(), f.clone()) {
                return Err(model_err(
                    f,
                    format!("tensor {hf_name} is also in {}", prev.display()),
                ));
            }
            let (rule, layer) = l.by_hf(&hf_name).ok_or_else(|| {
                model_err(
                    f,
                    format!(
                        "tensor {hf_name} has no place in a {} (lockstep's {arch} layout)",
                        l.hf_class
                    ),
                )
            })?;
            let gguf_name = match layer {
                Some(il) => layout::with_layer(rule.gguf, il),
                None => rule.gguf.to_string(),
            };
            if layer.is_some_and(|il| il >= layers_of(rule.gguf)) {
                return Err(model_err(
                    f,
                    format!(
                        "tensor {hf_name}: layer beyond the config's {} layers",
                        layers_of(rule.gguf)
                    ),
                ));
            }
            let ty = ggml_type_of(info.dtype).ok_or_else(|| {
                model_err(
                    f,
                    format!(
                        "tensor {hf_name} has dtype {:?}: lockstep reads F32, F16 and BF16",
                        info.dtype
                    ),
                )
            })?;
            let mut shape = info.shape.clone();
            if let (Transform::Flatten(k), 3) = (rule.transform, shape.len()) {
                if shape[2] != k {
                    return Err(model_err(
                        f,
                        format!(
                            "tensor {hf_name} has shape {shape:?}: expected a kernel width of {k}"
                        ),
                    ));
                }
                // a Conv1d weight [out, in, k]: the matrix [out, in·k] over the same bytes
                shape = vec![shape[0], shape[1] * k];
            }
            if shape.is_empty() || shape.len() > 2 || shape.contains(&0) {
                return Err(model_err(
                    f,
                    format!("tensor {hf_name} has shape {shape:?}: expected 1 or 2 non-zero dims"),
                ));
            }
            let es = if ty == GgmlType::F32 { 4 } else { 2 };
            let (s0, s1) = (info.data_offsets.0, info.data_offsets.1);
            let bytes = &map[data_start as usize + s0..data_start as usize + s1];
            let n_el: usize = shape.iter().product();
            let (rows, cols) = if shape.len() == 2 {
                (shape[0], shape[1])
            } else {
                (1, shape[0])
            };
            let mut dims: Vec<u64> = vec![cols as u64];
            if shape.len() == 2 {
                dims.push(rows as u64);
            }
            let mut out_ty = ty;
            let data: Option<(Vec<u8>, &str)> = match rule.transform {
                Transform::Same | Transform::Flatten(_) => None,
                Transform::Transpose => {
                    if shape.len() != 2 {
                        return Err(model_err(
                            f,
                            format!("tensor {hf_name} has shape {shape:?}: a Conv1D weight is 2-D"),
                        ));
                    }
                    dims = vec![rows as u64, cols as u64];
                    Some((
                        transpose(bytes, rows, cols, es),
                        "GPT-2 Conv1D [in, out] transposed to [out, in]",
                    ))
                }
                Transform::RopePermute(h) => {
                    let heads = if h == Heads::Query { n_head } else { n_head_kv };
                    let perm = layout::rope_permutation(rows, heads).ok_or_else(|| {
                        model_err(f, format!("tensor {hf_name} has {rows} rows: not {heads} heads of an even width"))
                    })?;
                    Some((
                        permute_rows(bytes, cols * es, &perm),
                        "Q/K rows to llama.cpp's interleaved RoPE pairs",
                    ))
                }
                Transform::NormOffset => {
                    out_ty = GgmlType::F32;
                    let v: Vec<u8> = (0..n_el)
                        .flat_map(|i| (elem_f32(ty, bytes, i) + 1.0).to_le_bytes())
                        .collect();
                    Some((v, "Gemma norm weight w - 1 + 1"))
                }
            };
            let n_bytes = match &data {
                Some((v, _)) => v.len(),
                None => bytes.len(),
            };
            let offset = match data {
                None => base + data_start + s0 as u64,
                Some((v, why)) => {
                    derived.push((gguf_name.clone(), v.len(), why.to_string()));
                    owned.push(v);
                    u64::MAX // placed below
                }
            };
            tensors.push(TensorInfo {
                name: gguf_name,
                dims,
                ggml_type: out_ty,
                offset,
                n_elements: n_el as u64,
                n_bytes,
            });
        }
        mapped_bytes += len;
        parts.push(Part {
            base,
            data: PartData::Map(map),
        });
        base = (base + len).div_ceil(64) * 64;
    }
    if let Some(wm) = &index {
        if let Some((k, f)) = wm.iter().find(|(k, _)| !seen.contains_key(*k)) {
            return Err(model_err(
                &dir.join(INDEX),
                format!("weight_map lists {k} in {f}, which has no such tensor"),
            ));
        }
    }
    for (name, vals) in extra {
        let v: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
        derived.push((name.clone(), v.len(), "made from config.json".into()));
        tensors.push(TensorInfo {
            name,
            dims: vec![vals.len() as u64],
            ggml_type: GgmlType::F32,
            offset: u64::MAX,
            n_elements: vals.len() as u64,
            n_bytes: v.len(),
        });
        owned.push(v);
    }
    // derived copies: one part each, after the maps
    let mut owned = owned.into_iter();
    for t in tensors.iter_mut().filter(|t| t.offset == u64::MAX) {
        let v = owned.next().expect("one owned buffer per derived tensor");
        t.offset = base;
        let len = v.len() as u64;
        parts.push(Part {
            base,
            data: PartData::Owned(v),
        });
        base = (base + len.max(1)).div_ceil(64) * 64;
    }
    // every required tensor is there
    let have: std::collections::HashSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    for r in l.tensors.iter().filter(|r| !r.optional) {
        let layers: Vec<Option<usize>> = if r.gguf.contains("{N}") {
            (0..layers_of(r.gguf)).map(Some).collect()
        } else {
            vec![None]
        };
        for il in layers {
            let g = il.map_or(r.gguf.to_string(), |i| layout::with_layer(r.gguf, i));
            if !have.contains(g.as_str()) {
                let hf = il.map_or(r.hf.to_string(), |i| layout::with_layer(r.hf, i));
                return Err(model_err(
                    &files[0],
                    format!("tensor {hf} (GGUF {g}) is missing"),
                ));
            }
        }
    }
    if arch == "gemma4" {
        // V = K exactly where config.json says so (attention_k_eq_v on the full-attention layers)
        let k_eq_v = cfg
            .get("attention_k_eq_v")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let types = meta
            .iter()
            .find(|(k, _)| k == "gemma4.attention.sliding_window_pattern")
            .and_then(|(_, v)| {
                v.as_array().map(|a| {
                    a.iter()
                        .map(|x| x.as_bool() == Some(true))
                        .collect::<Vec<_>>()
                })
            })
            .unwrap_or_default();
        for (il, sliding) in types.iter().enumerate() {
            let has_v = have.contains(layout::with_layer("blk.{N}.attn_v.weight", il).as_str());
            if has_v == (k_eq_v && !sliding) {
                return Err(model_err(
                    &files[0],
                    format!(
                        "layer {il}: v_proj {} but config.json attention_k_eq_v = {k_eq_v} ({} layer)",
                        if has_v { "present" } else { "missing" },
                        if *sliding { "sliding" } else { "full-attention" }
                    ),
                ));
            }
        }
    }
    meta.extend(tokenizer_json::meta_from_dir(dir, &cfg, l)?);
    GgufFile::from_parts(
        dir.to_path_buf(),
        meta,
        tensors,
        parts,
        HfSource {
            files,
            mapped_bytes,
            derived,
        },
    )
}

/// An error of an architecture loader on a model read from an HF directory, with the HF name of the tensor
/// it names (the loaders speak GGUF names): `tensor blk.0.attn_k.weight has shape ...` gains `(HF tensor
/// model.layers.0.self_attn.k_proj.weight)`. Other errors are returned as they are.
pub fn with_hf_names(e: Error, g: &GgufFile) -> Error {
    let Error::Model { path, what } = e else {
        return e;
    };
    let arch = g.get_str("general.architecture").unwrap_or("");
    let hf_name = g
        .hf_source()
        .and(layout::layout_of_arch(arch))
        .and_then(|l| {
            what.split([' ', '\'', ':', ',']).find_map(|w| {
                l.by_gguf(w)
                    .map(|(r, il)| il.map_or(r.hf.to_string(), |i| layout::with_layer(r.hf, i)))
            })
        });
    let what = match hf_name {
        Some(n) => format!("{what} (HF tensor {n})"),
        None => what,
    };
    Error::Model { path, what }
}

#[cfg(test)]
mod tests;
