//! `lockstep synth --arch whisper` (issue 44) through the binary: it writes a Hugging Face checkpoint
//! directory that the engine loads and `lockstep generate --audio` transcribes, prints its
//! `[[checkpoints]]` entry, and refuses `--hf-out`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn lockstep(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn synth_whisper_writes_a_checkpoint_that_generate_transcribes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("whisper-s1");
    let out = lockstep(&[
        "synth".as_ref(),
        "--arch".as_ref(),
        "whisper".as_ref(),
        "--seed".as_ref(),
        "1".as_ref(),
        "--out".as_ref(),
        dir.as_os_str(),
    ]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(text(&out.stdout).trim(), dir.display().to_string());
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "preprocessor_config.json",
    ] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let digest = lockstep::hash::sha256_hf_dir(&dir).unwrap();
    assert!(
        err.contains("[[checkpoints]]")
            && err.contains("id = \"whisper-s1\"")
            && err.contains("path = \"whisper-s1\"")
            && err.contains(&format!("sha256 = \"{digest}\"")),
        "{err}"
    );

    // the engine loads it and transcribes the committed WAVs greedily: ids of the 270-token vocabulary,
    // and not one token repeated (the Python maker's degeneracy check asks for 3 distinct tokens in 6; seed 1
    // passes it, as the Python maker's seed 1 does; `synth` itself does not check it, and some seeds fail it)
    let n = 6;
    let mut all = Vec::new();
    for wav in ["tones", "chirp"] {
        let audio = root().join(format!("golden/whisper-seeded/audio/{wav}.wav"));
        let out = lockstep(&[
            "generate".as_ref(),
            "--model".as_ref(),
            dir.as_os_str(),
            "--audio".as_ref(),
            audio.as_os_str(),
            "-n".as_ref(),
            n.to_string().as_ref(),
        ]);
        assert!(out.status.success(), "{wav}: {}", text(&out.stderr));
        let stdout = text(&out.stdout);
        let ids: Vec<u32> = stdout
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .map(|t| t.parse().unwrap_or_else(|e| panic!("{wav}: {t:?}: {e}")))
            .collect();
        assert!(!ids.is_empty() && ids.len() <= n, "{wav}: {stdout}");
        assert!(ids.iter().all(|&t| t < 270), "{wav}: {ids:?}");
        if ids.len() == n {
            let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
            assert!(distinct.len() >= 3, "{wav}: degenerate {ids:?}");
        }
        all.push(ids);
    }
    assert_ne!(all[0], all[1], "the audio moves the transcription");
}

#[test]
fn synth_whisper_refuses_hf_out_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, hf) = (tmp.path().join("w"), tmp.path().join("hf"));
    let out = lockstep(&[
        "synth".as_ref(),
        "--arch".as_ref(),
        "whisper".as_ref(),
        "--out".as_ref(),
        dir.as_os_str(),
        "--hf-out".as_ref(),
        hf.as_os_str(),
    ]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--hf-out") && err.contains("whisper") && err.contains("--out"),
        "{err}"
    );
    assert!(!dir.exists() && !hf.exists(), "nothing written");
}
