//! Every command of README.md's shell blocks is accounted for (issue 46): `ci/readme-commands.py --check`
//! extracts them (```sh blocks; continuation lines and here-documents joined) and matches
//! `ci/readme-commands.toml`, whose entries say which commands run in a concrete form (`instead`), only with
//! `--long` or never (`skip`), each with its reason; the rest run as written. Running them is
//! `ci/readme-commands.py` itself (a fresh clone, minutes to hours); this test is the fast part: the README and
//! the manifest agree, an untagged fence or a stale entry is an error, and the extraction sees every command.

use std::path::Path;
use std::process::Command;

mod common;
use common::root;

/// `ci/readme-commands.py ARGS` in the checkout: (exit status, stdout, stderr).
fn script(args: &[&str]) -> (i32, String, String) {
    let out = Command::new("python3")
        .arg(root().join("ci/readme-commands.py"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("python3 runs ci/readme-commands.py");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn with_files(dir: &Path, readme: &str, manifest: &str) -> (i32, String, String) {
    let r = dir.join("README.md");
    let m = dir.join("manifest.toml");
    std::fs::write(&r, readme).unwrap();
    std::fs::write(&m, manifest).unwrap();
    script(&[
        "--check",
        "--list",
        "--readme",
        r.to_str().unwrap(),
        "--manifest",
        m.to_str().unwrap(),
    ])
}

#[test]
fn every_readme_shell_command_is_accounted_for() {
    let (code, out, err) = script(&["--check"]);
    assert_eq!(code, 0, "{out}{err}");
    // the count the script prints is the README's: every ```sh line that is not a comment or a continuation
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let blocks = text.matches("\n```sh\n").count();
    assert!(out.contains(&format!("in {blocks} shell blocks")), "{out}");
    assert!(!out.contains("manifest problems"), "{out}");
}

#[test]
fn the_extraction_joins_continuations_and_here_documents_and_drops_comments() {
    let d = tempfile::tempdir().unwrap();
    let readme = "# t\n\n```sh\n# a comment\nlockstep run \\\n    --model a   # trailing\n\ncat > f <<EOF\nx = 1\nEOF\n```\n\n```text\nnot a command\n```\n";
    let manifest = "[[command]]\ntext = \"lockstep run --model a\"\nskip = \"a reason in words\"\n";
    let (code, out, err) = with_files(d.path(), readme, manifest);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("2 commands in 1 shell blocks: 1 run, 1 skip"),
        "{out}"
    );
    assert!(
        out.contains("1. lockstep run --model a\n      -> skip: a reason in words"),
        "{out}"
    );
    assert!(
        out.contains("2. cat > f <<EOF <<x = 1\n      -> run"),
        "{out}"
    );
}

#[test]
fn a_stale_entry_an_untagged_fence_and_a_reasonless_entry_are_errors() {
    let d = tempfile::tempdir().unwrap();
    let readme = "```sh\nlockstep run\n```\n";
    let (code, _, err) = with_files(
        d.path(),
        readme,
        "[[command]]\ntext = \"lockstep gone\"\nlong = \"no longer in the README\"\n",
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("'lockstep gone' is no command of README.md"),
        "{err}"
    );

    let (code, _, err) = with_files(d.path(), "```\nlockstep run\n```\n", "");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("without a language tag"), "{err}");

    let (code, _, err) = with_files(
        d.path(),
        readme,
        "[[command]]\ntext = \"lockstep run\"\nskip = \"\"\n",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("must give the reason"), "{err}");

    let (code, _, err) = with_files(
        d.path(),
        readme,
        "[[command]]\ntext = \"lockstep run\"\ninstead = \"lockstep run --model x\"\n",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`instead` needs `why`"), "{err}");
}
