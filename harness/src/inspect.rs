//! `lockstep inspect`: a GGUF file or a Hugging Face checkpoint directory described — name, architecture,
//! size, parameters, bits per weight and the tensors of each ggml type; for a directory also its format,
//! its `config.json` class, the safetensors files mapped, the digest ([`crate::hash::sha256_hf_dir`]) and the
//! tensors the engine holds as derived copies in memory (where the HF and GGUF layouts differ) with their
//! bytes — as text or as one JSON object.

use std::path::Path;

use anyhow::{Context, Result};

/// `lockstep inspect`: `general.name`, `general.architecture`, file size, parameters (elements of every
/// tensor), bits per weight as llama.cpp prints it ([`lockstep_engine::gguf::GgufFile::bits_per_weight`])
/// and the tensor count, elements and bytes per ggml type — as text, or as one JSON object.
///
/// Errors: the file is not a valid GGUF, or the directory not a checkpoint the engine reads (naming the file
/// and the fault).
pub fn inspect(path: &Path, json: bool) -> Result<String> {
    let g =
        lockstep_engine::hf::open(path).with_context(|| format!("reading {}", path.display()))?;
    let name = g.get_str("general.name").unwrap_or("");
    let arch = g.get_str("general.architecture").unwrap_or("");
    let counts = g.type_counts();
    let params: u64 = counts.iter().map(|c| c.elements).sum();
    let bpw = g.bits_per_weight();
    let hf = match g.hf_source() {
        None => None,
        Some(h) => {
            let cfg: serde_json::Value = serde_json::from_slice(
                &std::fs::read(path.join("config.json"))
                    .with_context(|| format!("reading {}", path.join("config.json").display()))?,
            )
            .with_context(|| format!("{}: not JSON", path.join("config.json").display()))?;
            let class = cfg["architectures"][0].as_str().unwrap_or("").to_string();
            Some((h.clone(), class, crate::hash::sha256_hf_dir(path)?))
        }
    };
    if json {
        let types: Vec<serde_json::Value> = counts
            .iter()
            .map(|c| {
                serde_json::json!({
                    "type": c.ggml_type.name(),
                    "tensors": c.tensors,
                    "elements": c.elements,
                    "bytes": c.bytes,
                })
            })
            .collect();
        let mut v = serde_json::json!({
            "path": path.display().to_string(),
            "format": if hf.is_some() { "hf" } else { "gguf" },
            "name": name,
            "architecture": arch,
            "file_size": g.file_size(),
            "n_params": params,
            "bits_per_weight": bpw,
            "types": types,
        });
        if let Some((h, class, sha)) = &hf {
            v["hf"] = serde_json::json!({
                "class": class,
                "sha256": sha,
                "files": h.files.iter().map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned())).collect::<Vec<_>>(),
                "mapped_bytes": h.mapped_bytes,
                "derived_bytes": h.derived.iter().map(|d| d.1 as u64).sum::<u64>(),
                "derived": h.derived.iter().map(|(n, b, why)| serde_json::json!({"tensor": n, "bytes": b, "why": why})).collect::<Vec<_>>(),
            });
        }
        return Ok(serde_json::to_string_pretty(&v)?);
    }
    let mut out = format!(
        "{}\n  name {name:?}, architecture {arch:?}\n  {} bytes, {params} parameters, {} bits per weight\n",
        path.display(),
        g.file_size(),
        bpw.map_or("-".into(), |b| format!("{b:.4}")),
    );
    for c in &counts {
        out += &format!(
            "  {:<8} {:>4} tensors {:>12} elements {:>12} bytes\n",
            c.ggml_type.name(),
            c.tensors,
            c.elements,
            c.bytes
        );
    }
    if let Some((h, class, sha)) = &hf {
        let derived: usize = h.derived.iter().map(|d| d.1).sum();
        out += &format!(
            "  Hugging Face checkpoint ({class}), digest {sha}\n  {} safetensors file(s), {} bytes mapped; {} tensor(s) derived in memory, {derived} bytes\n",
            h.files.len(),
            h.mapped_bytes,
            h.derived.len(),
        );
        for (n, b, why) in &h.derived {
            out += &format!("    {n:<34} {b:>10} bytes  {why}\n");
        }
    }
    Ok(out.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::session::tiny_model_file as tiny;

    #[test]
    fn json_counts_every_tensor_once() {
        let (_d, p) = tiny();
        let v: serde_json::Value = serde_json::from_str(&inspect(&p, true).unwrap()).unwrap();
        assert_eq!(v["architecture"], "llama");
        assert_eq!(v["file_size"], std::fs::metadata(&p).unwrap().len());
        let types = v["types"].as_array().unwrap();
        let names: Vec<&str> = types.iter().map(|t| t["type"].as_str().unwrap()).collect();
        // the tiny model's matrices are Q4_1, its embedding Q8_0, its norms F32
        for t in ["Q4_1", "Q8_0", "F32"] {
            assert!(names.contains(&t), "{names:?}");
        }
        let elements: u64 = types.iter().map(|t| t["elements"].as_u64().unwrap()).sum();
        assert_eq!(v["n_params"].as_u64().unwrap(), elements);
        let bpw = v["bits_per_weight"].as_f64().unwrap();
        assert!(bpw > 4.0 && bpw < 32.0, "{bpw}");
    }

    #[test]
    fn text_names_the_file_and_one_line_per_type() {
        let (_d, p) = tiny();
        let text = inspect(&p, false).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next().unwrap(), p.display().to_string());
        assert!(lines.next().unwrap().contains("architecture \"llama\""));
        assert!(lines.next().unwrap().contains("bits per weight"));
        assert_eq!(lines.filter(|l| l.contains(" tensors ")).count(), 3);
        assert!(!text.ends_with('\n'));
    }

    #[test]
    fn describes_a_hugging_face_directory_and_its_derived_copies() {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("l.gguf");
        crate::synth::write_synth("llama", 1, &gguf).unwrap();
        let hf = dir.path().join("hf");
        crate::hf::export_hf(&gguf, &hf).unwrap();
        let v: serde_json::Value = serde_json::from_str(&inspect(&hf, true).unwrap()).unwrap();
        assert_eq!(v["format"], "hf");
        assert_eq!(v["architecture"], "llama");
        assert_eq!(v["hf"]["class"], "LlamaForCausalLM");
        assert_eq!(
            v["hf"]["sha256"].as_str().unwrap(),
            crate::hash::sha256_hf_dir(&hf).unwrap()
        );
        // llama's Q and K of both layers are permuted copies: 2 x (256 + 128) rows of 256 f32
        let derived = v["hf"]["derived"].as_array().unwrap();
        assert_eq!(derived.len(), 4, "{derived:?}");
        assert_eq!(v["hf"]["derived_bytes"], 2 * (256 + 128) * 256 * 4);
        let g: serde_json::Value = serde_json::from_str(&inspect(&gguf, true).unwrap()).unwrap();
        assert_eq!(g["format"], "gguf");
        assert_eq!(g["n_params"], v["n_params"]);
        let text = inspect(&hf, false).unwrap();
        assert!(
            text.contains("blk.0.attn_q.weight") && text.contains("derived in memory"),
            "{text}"
        );
    }

    #[test]
    fn a_file_that_is_not_gguf_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("junk.gguf");
        std::fs::write(&p, b"not a gguf file at all").unwrap();
        let e = inspect(&p, false).unwrap_err();
        assert!(format!("{e:#}").contains("junk.gguf"), "{e:#}");
    }
}
