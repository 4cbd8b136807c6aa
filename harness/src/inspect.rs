//! `lockstep inspect`: a GGUF file described — name, architecture, size, parameters, bits per weight and
//! the tensors of each ggml type — as text or as one JSON object.

use std::path::Path;

use anyhow::{Context, Result};

/// `lockstep inspect`: `general.name`, `general.architecture`, file size, parameters (elements of every
/// tensor), bits per weight as llama.cpp prints it ([`lockstep_engine::gguf::GgufFile::bits_per_weight`])
/// and the tensor count, elements and bytes per ggml type — as text, or as one JSON object.
///
/// Errors: the file is not a valid GGUF (naming the file and the fault).
pub fn inspect(path: &Path, json: bool) -> Result<String> {
    let g = lockstep_engine::gguf::GgufFile::open(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let name = g.get_str("general.name").unwrap_or("");
    let arch = g.get_str("general.architecture").unwrap_or("");
    let counts = g.type_counts();
    let params: u64 = counts.iter().map(|c| c.elements).sum();
    let bpw = g.bits_per_weight();
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
        let v = serde_json::json!({
            "path": path.display().to_string(),
            "name": name,
            "architecture": arch,
            "file_size": g.file_size(),
            "n_params": params,
            "bits_per_weight": bpw,
            "types": types,
        });
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
    fn a_file_that_is_not_gguf_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("junk.gguf");
        std::fs::write(&p, b"not a gguf file at all").unwrap();
        let e = inspect(&p, false).unwrap_err();
        assert!(format!("{e:#}").contains("junk.gguf"), "{e:#}");
    }
}
