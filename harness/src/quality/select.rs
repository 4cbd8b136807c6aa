//! Which files `lockstep quality` scores: the base and the variants from `--base`, `--variant` and
//! `--variants-dir` with `--types`, and the variants `--check-llama-perplexity` cross-checks — every name
//! checked before anything is scored.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The types `lockstep quality --variants-dir` scores when `--types` is not given (those present).
pub const DEFAULT_TYPES: &[&str] = &[
    "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_1", "Q5_0", "Q4_K", "Q4_1", "Q4_0", "IQ4_NL",
    "IQ4_XS", "Q3_K", "Q2_K",
];

/// The variants `lockstep quality --check-llama-perplexity` cross-checks when `--check-types` is not given
/// (those in the run).
pub const DEFAULT_CHECK_TYPES: &[&str] = &["Q8_0", "Q4_0"];

/// Label of a variant file: the text after the last `-` of the file stem (`smollm2-135m-q4_1-Q8_0.gguf` →
/// `Q8_0`), or the whole stem.
pub fn variant_label(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    stem.rsplit_once('-')
        .map_or(stem.clone(), |(_, t)| t.to_string())
}

/// The type labels of the `*.gguf` files in `dir` ([`variant_label`]), sorted, each once: the types
/// `--types` may name.
///
/// Errors: an unreadable directory (named).
pub fn types_in_dir(dir: &Path) -> Result<Vec<String>> {
    let mut t: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list the variants directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .map(|p| variant_label(&p))
        .collect();
    t.sort();
    t.dedup();
    Ok(t)
}

/// Resolves `DIR` + type labels to files: the one `*-<TYPE>.gguf` in `dir` for each type (case-insensitive).
///
/// Errors: an unreadable directory; a type with no file, or with several (all named).
pub fn files_for_types(dir: &Path, types: &[String]) -> Result<Vec<PathBuf>> {
    let names: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list the variants directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    types
        .iter()
        .map(|t| {
            let hits: Vec<&PathBuf> = names
                .iter()
                .filter(|p| variant_label(p).eq_ignore_ascii_case(t))
                .collect();
            match hits.as_slice() {
                [one] => Ok((*one).clone()),
                [] => bail!("no file *-{t}.gguf in {}", dir.display()),
                many => bail!(
                    "several files for type {t} in {}: {}",
                    dir.display(),
                    many.iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        })
        .collect()
}

/// The base of `--variants-dir DIR` without `--base`: its one `*-F32.gguf`.
///
/// Errors: an unreadable directory; several F32 files; none — then the message says how to make it
/// (`lockstep fetch` makes the registered variants and keeps no F32 file; `lockstep quantize --type F32`
/// writes one, named for the model of the directory, `variants/<ID>/`).
pub fn base_in_dir(dir: &Path) -> Result<PathBuf> {
    let f32 = "F32".to_string();
    if types_in_dir(dir)?
        .iter()
        .any(|t| t.eq_ignore_ascii_case(&f32))
    {
        return Ok(files_for_types(dir, &[f32])?.remove(0));
    }
    let id = dir
        .file_name()
        .map_or_else(|| "ID".to_string(), |n| n.to_string_lossy().into_owned());
    bail!(
        "no base: {} holds no *-F32.gguf (the variants `lockstep fetch` makes keep none); make it with \
         `lockstep quantize --model {id} --type F32 --out {}`, or give --base FILE",
        dir.display(),
        dir.join(format!("{id}-F32.gguf")).display()
    )
}

/// The base and the variants of a run: `base`, else the `*-F32.gguf` of `variants_dir`; the `variants`
/// given, then those of `variants_dir` — the `types` given (each once, each present), or the
/// [`DEFAULT_TYPES`] the directory holds (the absent ones named through `log`).
///
/// Errors: no base; a type given twice or with no file (listing the types there); no variant at all; an
/// unreadable directory.
pub fn select_files(
    base: Option<&Path>,
    variants: &[PathBuf],
    variants_dir: Option<&Path>,
    types: Option<&[String]>,
    log: &mut dyn FnMut(&str),
) -> Result<(PathBuf, Vec<PathBuf>)> {
    let base = match (base, variants_dir) {
        (Some(b), _) => b.to_path_buf(),
        (None, Some(d)) => base_in_dir(d)?,
        (None, None) => bail!("give --base F32.gguf, or --variants-dir DIR holding a *-F32.gguf"),
    };
    let mut variants = variants.to_vec();
    if let Some(d) = variants_dir {
        let known = types_in_dir(d)?;
        match types {
            Some(types) => {
                let mut seen: Vec<&str> = Vec::new();
                for t in types {
                    if seen.iter().any(|s| s.eq_ignore_ascii_case(t)) {
                        bail!("--types {t}: given twice");
                    }
                    seen.push(t);
                    if !known.iter().any(|k| k.eq_ignore_ascii_case(t)) {
                        bail!(
                            "--types {t}: unknown type, no file *-{t}.gguf in {}; the types there: {}",
                            d.display(),
                            if known.is_empty() {
                                "none".to_string()
                            } else {
                                known.join(", ")
                            }
                        );
                    }
                }
                variants.extend(files_for_types(d, types)?);
            }
            None => {
                let present: Vec<String> = DEFAULT_TYPES
                    .iter()
                    .filter(|t| known.iter().any(|k| k.eq_ignore_ascii_case(t)))
                    .map(|t| t.to_string())
                    .collect();
                let absent: Vec<&str> = DEFAULT_TYPES
                    .iter()
                    .copied()
                    .filter(|t| !present.iter().any(|p| p == t))
                    .collect();
                if !absent.is_empty() {
                    log(&format!(
                        "{} holds no file for the default types {} (give --types to choose)",
                        d.display(),
                        absent.join(", ")
                    ));
                }
                variants.extend(files_for_types(d, &present)?);
            }
        }
    }
    if variants.is_empty() {
        bail!("no variants: give --variant FILE (repeatable) or --variants-dir DIR --types ...");
    }
    Ok((base, variants))
}

/// The variant types `--check-llama-perplexity` cross-checks: none without it; `given` (`--check-types`);
/// else the [`DEFAULT_CHECK_TYPES`] among the run's `variants`.
///
/// Errors: a cross-check with no `--check-types` and none of the default types in the run (listing the
/// run's variants).
pub fn check_types(
    cross_check: bool,
    given: Option<Vec<String>>,
    variants: &[PathBuf],
) -> Result<Vec<String>> {
    match (cross_check, given) {
        (false, _) => Ok(Vec::new()),
        (true, Some(t)) => Ok(t),
        (true, None) => {
            let labels: Vec<String> = variants.iter().map(|v| variant_label(v)).collect();
            let t: Vec<String> = DEFAULT_CHECK_TYPES
                .iter()
                .filter(|t| labels.iter().any(|l| l.eq_ignore_ascii_case(t)))
                .map(|t| t.to_string())
                .collect();
            if t.is_empty() {
                bail!(
                    "--check-llama-perplexity: none of the default types {} is a variant of this run; give \
                     --check-types (the run's variants: {})",
                    DEFAULT_CHECK_TYPES.join(","),
                    labels.join(", ")
                );
            }
            Ok(t)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_from_file_names() {
        assert_eq!(
            variant_label(Path::new("/x/smollm2-135m-q4_1-Q8_0.gguf")),
            "Q8_0"
        );
        assert_eq!(variant_label(Path::new("model.gguf")), "model");
    }

    fn dir_with(files: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for f in files {
            std::fs::write(d.path().join(f), b"").unwrap();
        }
        d
    }

    #[test]
    fn a_directory_without_an_f32_file_says_how_to_make_one() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("smollm2-135m-q4_1");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("smollm2-135m-q4_1-Q8_0.gguf"), b"").unwrap();
        let e = select_files(None, &[], Some(&dir), None, &mut |_| {})
            .unwrap_err()
            .to_string();
        let want = format!(
            "`lockstep quantize --model smollm2-135m-q4_1 --type F32 --out {}`",
            dir.join("smollm2-135m-q4_1-F32.gguf").display()
        );
        assert!(
            e.contains("holds no *-F32.gguf") && e.contains(&want),
            "{e}"
        );
    }

    #[test]
    fn the_base_and_the_present_default_types_of_a_directory() {
        let d = dir_with(&[
            "m-F32.gguf",
            "m-Q8_0.gguf",
            "m-q4_0.gguf",
            "m-Q9_9.gguf",
            "notes.txt",
        ]);
        let mut logged = Vec::new();
        let (base, vars) = select_files(None, &[], Some(d.path()), None, &mut |m| {
            logged.push(m.to_string())
        })
        .unwrap();
        assert_eq!(base, d.path().join("m-F32.gguf"));
        // in DEFAULT_TYPES' order; Q9_9 is not a default type
        assert_eq!(
            vars,
            vec![d.path().join("m-Q8_0.gguf"), d.path().join("m-q4_0.gguf")]
        );
        assert_eq!(logged.len(), 1);
        assert!(
            logged[0].contains("F16, BF16") && !logged[0].contains("Q8_0"),
            "{logged:?}"
        );
        assert_eq!(
            types_in_dir(d.path()).unwrap(),
            ["F32", "Q8_0", "Q9_9", "q4_0"]
        );
    }

    #[test]
    fn types_are_checked_before_anything_is_scored() {
        let d = dir_with(&["m-F32.gguf", "m-Q8_0.gguf"]);
        let mut log = |_: &str| {};
        let twice = ["Q8_0".to_string(), "q8_0".to_string()];
        let e = select_files(None, &[], Some(d.path()), Some(&twice), &mut log).unwrap_err();
        assert_eq!(e.to_string(), "--types q8_0: given twice");
        let unknown = ["Q2_K".to_string()];
        let e = select_files(None, &[], Some(d.path()), Some(&unknown), &mut log).unwrap_err();
        assert!(e.to_string().contains("the types there: F32, Q8_0"), "{e}");
        let e = select_files(None, &[], None, None, &mut log).unwrap_err();
        assert!(e.to_string().contains("give --base"), "{e}");
        let e = select_files(Some(Path::new("b.gguf")), &[], None, None, &mut log).unwrap_err();
        assert!(e.to_string().starts_with("no variants"), "{e}");
    }

    #[test]
    fn cross_checked_types() {
        let vars = [PathBuf::from("m-Q8_0.gguf"), PathBuf::from("m-Q2_K.gguf")];
        assert!(check_types(false, Some(vec!["X".into()]), &vars)
            .unwrap()
            .is_empty());
        assert_eq!(check_types(true, None, &vars).unwrap(), ["Q8_0"]);
        assert_eq!(
            check_types(true, Some(vec!["Q2_K".into()]), &vars).unwrap(),
            ["Q2_K"]
        );
        let e = check_types(true, None, &vars[1..]).unwrap_err();
        assert!(e.to_string().contains("the run's variants: Q2_K"), "{e}");
    }
}
