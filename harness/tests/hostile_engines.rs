//! Hostile engines and hostile input files (issue 47, causes 1, 2, 4, 10, 11, 12): a session engine that
//! answers a dump outside its scratch directory, a FIFO, contradictory `load` answers; `lockstep serve`
//! given a scratch holding files, a model that is a FIFO or a directory without config.json, injections it
//! cannot apply; FIFOs, devices and oversized files as `merge`/`gate` reports, cost tables, stage maps and
//! the CI step summary; and an engine helper that calls `setsid()` to leave its process group.
//!
//! Every case that used to hang runs under a deadline ([`within`]), so a regression fails instead of
//! blocking the suite.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockstep::capture::NullSink;
use lockstep::dump::Dump;
use lockstep::engine::Engine;
use lockstep::protocol::client::{ServeCommand, SessionEngine};
use lockstep::protocol::Reply;
use lockstep_engine::{GgmlTarget, NumericsMode, Simd};
use ndarray::Array2;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lockstep"))
}

/// Run `f` on a thread; its result, or a panic saying it did not return within `secs` (it is left blocked:
/// the test process ends anyway).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what}: did not return within {secs} s (blocked?)"))
}

fn mkfifo(p: &Path) {
    let ok = Command::new("mkfifo").arg(p).status().unwrap().success();
    assert!(ok, "mkfifo {}", p.display());
}

/// `lockstep args` with `envs`, killed after `secs`: (exit code, stderr); code -1 when it was killed.
fn lockstep_timed(args: &[&str], envs: &[(&str, &Path)], secs: u64) -> (i32, String) {
    let mut c = Command::new(exe());
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    let t0 = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code().unwrap_or(-1);
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            break -1;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        !err.contains("panicked"),
        "lockstep {args:?} panicked:\n{err}"
    );
    (code, err)
}

/// A session engine in `dir` (a shell script): answers `load` with `load` (one JSON line), every step with
/// the dump `$dump` that the shell snippet `step` sets (it may use `$scratch`, the directory `load` gave,
/// and `$n`, the step's number), anything else with `{"ok":true}`.
fn shell_engine(dir: &Path, load: &str, step: &str) -> ServeCommand {
    let script = dir.join("engine.sh");
    std::fs::write(
        &script,
        format!(
            r#"#!/bin/sh
n=0
while IFS= read -r line; do
  case "$line" in
    *'"op":"load"'*)
      scratch=$(printf '%s\n' "$line" | sed -n 's/.*"scratch":"\([^"]*\)".*/\1/p')
      echo '{load}' ;;
    *'"op":"prefill"'*|*'"op":"decode"'*)
      {step}
      n=$((n + 1))
      echo "{{\"ok\":true,\"dump\":\"$dump\"}}" ;;
    *) echo '{{"ok":true}}' ;;
  esac
done
"#
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    ServeCommand {
        command: script.display().to_string(),
        timeout: Duration::from_secs(20),
        stage_map: None,
        stage_map_file: None,
    }
}

const LOAD_OK: &str = r#"{"ok":true,"protocol":2,"engine":"hostile@1"}"#;

/// A valid two-token dump: logits `[2, vocab]`, the stage `blk.0.out` `[2, 8]`.
fn write_dump(path: &Path, vocab: usize) {
    let mut stages = BTreeMap::new();
    stages.insert("blk.0.out".to_string(), Array2::<f32>::ones((2, 8)));
    lockstep::dump::write(
        path,
        &Dump {
            tokens: vec![1, 2],
            logits: Some(Array2::<f32>::ones((2, vocab))),
            stages,
        },
    )
    .unwrap();
}

/// Start `cmd` as a session engine and run one two-token prefill; the error, if any, as text.
fn one_step(cmd: ServeCommand, work: &Path) -> Result<(), String> {
    let model = work.join("m.gguf");
    let mut e = SessionEngine::start(
        cmd,
        &model,
        "llama",
        NumericsMode::Reference,
        GgmlTarget::Avx2,
    )
    .map_err(|e| format!("{e:#}"))?;
    e.reset(NumericsMode::Reference, GgmlTarget::Avx2, 8)
        .map_err(|e| format!("{e:#}"))?;
    e.forward(&[1, 2], &mut NullSink)
        .map(drop)
        .map_err(|e| format!("{e:#}"))
}

/// Cause 1: a dump answered outside the scratch directory (by `..` or by a symlink) is refused, and the
/// file it names is neither read as the step's nor deleted.
#[test]
fn a_dump_outside_the_scratch_directory_is_refused_and_left_alone() {
    let work = tempfile::tempdir().unwrap();
    let victim_dir = work.path().join("victim");
    std::fs::create_dir(&victim_dir).unwrap();
    let victim = victim_dir.join("step-0.npz");
    write_dump(&victim, 16);
    let up = "/..".repeat(40);
    for step in [
        format!("dump=\"$scratch{up}{}\"", victim.display()),
        format!(
            "ln -s {} \"$scratch/step-$n.npz\"; dump=\"$scratch/step-$n.npz\"",
            victim.display()
        ),
    ] {
        let e = one_step(shell_engine(work.path(), LOAD_OK, &step), work.path()).unwrap_err();
        assert!(
            e.contains("is not inside the") && e.contains("scratch directory"),
            "{step}: {e}"
        );
        assert!(victim.is_file(), "{step}: the victim file was deleted");
    }
    // the control: a dump inside the scratch is read (and removed)
    let fixture = work.path().join("fixture.npz");
    write_dump(&fixture, 16);
    let step = format!(
        "cp {} \"$scratch/step-$n.npz\"; dump=\"$scratch/step-$n.npz\"",
        fixture.display()
    );
    one_step(shell_engine(work.path(), LOAD_OK, &step), work.path()).unwrap();
}

/// The answers of a `lockstep serve` fed `lines` (in process).
fn serve(lines: &[String]) -> Vec<Reply> {
    let input = lines.join("\n") + "\n";
    let mut out = Vec::new();
    lockstep::protocol::server::serve(input.as_bytes(), &mut out, Simd::Off).unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn load_line(model: &Path, format: &str, scratch: &Path) -> String {
    serde_json::json!({
        "op": "load", "protocol": 2, "model": model, "format": format, "mode": "reference",
        "target": "avx2", "scratch": scratch,
    })
    .to_string()
}

const RESET: &str =
    r#"{"op":"reset","mode":"reference","target":"avx2","n_ctx":8,"input_rounding":false}"#;
const PREFILL: &str = r#"{"op":"prefill","tokens":[1,2],"stages":"all"}"#;

fn err(r: &Reply) -> String {
    r.error.clone().unwrap_or_default()
}

/// Cause 1, `lockstep serve`'s side: it creates its dumps new in the scratch it is given and never
/// replaces a file that was there; a scratch that is not a directory is refused.
#[test]
fn serve_never_replaces_a_file_in_its_scratch_and_refuses_a_scratch_that_is_a_file() {
    let work = tempfile::tempdir().unwrap();
    let gguf = work.path().join("m.gguf");
    lockstep::synth::write_synth("llama", 1, &gguf).unwrap();
    let scratch = work.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    for n in 0..3 {
        std::fs::write(scratch.join(format!("step-{n}.npz")), "precious").unwrap();
    }
    let as_file = work.path().join("not-a-dir");
    std::fs::write(&as_file, "precious").unwrap();
    let r = serve(&[
        load_line(&gguf, "gguf", &scratch),
        RESET.into(),
        PREFILL.into(),
        r#"{"op":"decode","token":3,"stages":"all"}"#.into(),
        load_line(&gguf, "gguf", &as_file),
    ]);
    for a in &r[..4] {
        assert!(a.error.is_none(), "{r:?}");
    }
    for a in &r[2..4] {
        let dump = PathBuf::from(a.dump.clone().unwrap());
        assert_eq!(dump.parent(), Some(scratch.as_path()));
        lockstep::dump::read(&dump).unwrap();
    }
    for n in 0..3 {
        assert_eq!(
            std::fs::read_to_string(scratch.join(format!("step-{n}.npz"))).unwrap(),
            "precious",
            "step-{n}.npz was replaced"
        );
    }
    assert!(err(&r[4]).contains("is not a directory"), "{r:?}");
    assert_eq!(std::fs::read_to_string(&as_file).unwrap(), "precious");
}

/// Cause 10: `inject` of a value of the wrong width, of a stage the model does not emit, or of the
/// logits is refused, not acknowledged and ignored; a right one is taken and changes the next step.
#[test]
fn serve_refuses_injections_it_cannot_apply() {
    let work = tempfile::tempdir().unwrap();
    let gguf = work.path().join("m.gguf");
    lockstep::synth::write_synth("llama", 1, &gguf).unwrap();
    let model = lockstep_engine::Model::load(&gguf).unwrap();
    let (stage, width) = model
        .stages()
        .into_iter()
        .find(|(s, _)| s.to_string() == "blk.0.out")
        .expect("blk.0.out");
    let n_layer = model
        .stages()
        .iter()
        .filter(|(s, _)| s.to_string().ends_with(".out"))
        .count();
    let value = |name: &str, w: usize| {
        let p = work.path().join(format!("{name}.npz"));
        lockstep::protocol::client::write_value(&p, &Array2::<f32>::from_elem((2, w), 0.5))
            .unwrap();
        p
    };
    let inject = |stage: &str, p: &Path| {
        serde_json::json!({"op": "inject", "stage": stage, "npz": p}).to_string()
    };
    let beyond = format!("blk.{}.out", n_layer + 90);
    let r = serve(&[
        load_line(&gguf, "gguf", work.path()),
        RESET.into(),
        inject(&stage.to_string(), &value("wide", width + 1)),
        inject(&beyond, &value("beyond", width)),
        inject("logits", &value("logits", model.info().n_vocab)),
        inject(&stage.to_string(), &value("right", width)),
    ]);
    let e = err(&r[2]);
    assert!(
        e.contains(&format!("{stage} is {width} wide")) && e.contains("nothing injected"),
        "{r:?}"
    );
    assert!(
        err(&r[3]).contains(&beyond) && err(&r[3]).contains("emits no such stage"),
        "{r:?}"
    );
    assert!(err(&r[4]).contains("model's output"), "{r:?}");
    assert!(r[5].error.is_none(), "{r:?}");
}

/// Cause 12: a `load` answer the engine's own dumps contradict — an `n_vocab` other than the logits'
/// width, an absurd `n_vocab`, an announced stage no dump holds — fails naming the engine; the same engine
/// answering consistently passes.
#[test]
fn contradictory_load_answers_are_refused() {
    let work = tempfile::tempdir().unwrap();
    let fixture = work.path().join("fixture.npz");
    write_dump(&fixture, 263);
    let step = format!(
        "cp {} \"$scratch/step-$n.npz\"; dump=\"$scratch/step-$n.npz\"",
        fixture.display()
    );
    let load = |extra: &str| format!(r#"{{"ok":true,"protocol":2,"engine":"hostile@1"{extra}}}"#);
    for (extra, needles) in [
        (
            r#","n_vocab":7"#,
            &["hostile@1", "n_vocab 7", "263 wide"][..],
        ),
        (
            r#","n_vocab":1099511627776"#,
            &["hostile@1", "n_vocab 1099511627776"][..],
        ),
        (
            r#","n_vocab":263,"stages":["blk.0.out","blk.7.ffn_out"]"#,
            &["hostile@1", "announced 1 stage", "`blk.7.ffn_out`"][..],
        ),
    ] {
        let e = one_step(shell_engine(work.path(), &load(extra), &step), work.path()).unwrap_err();
        for n in needles {
            assert!(e.contains(n), "{extra}: {e}");
        }
    }
    one_step(
        shell_engine(
            work.path(),
            &load(r#","n_vocab":263,"stages":["blk.0.out"]"#),
            &step,
        ),
        work.path(),
    )
    .unwrap();
}

/// Causes 2 and 11, the engine side: a FIFO answered as a dump, a FIFO or a bare directory as `serve`'s
/// model, a FIFO as an injection are refused at once with errors naming them.
#[test]
fn fifos_from_and_to_engines_are_refused_at_once() {
    let work = tempfile::tempdir().unwrap();
    let step = "mkfifo \"$scratch/step-$n.npz\"; dump=\"$scratch/step-$n.npz\"";
    let cmd = shell_engine(work.path(), LOAD_OK, step);
    let w = work.path().to_path_buf();
    let e = within(60, "a FIFO dump", move || one_step(cmd, &w)).unwrap_err();
    assert!(e.contains("FIFO") && e.contains("step-0.npz"), "{e}");

    let gguf = work.path().join("m.gguf");
    lockstep::synth::write_synth("llama", 1, &gguf).unwrap();
    let fifo_model = work.path().join("fifo.gguf");
    mkfifo(&fifo_model);
    let bare = work.path().join("bare-dir");
    std::fs::create_dir(&bare).unwrap();
    let fifo_value = work.path().join("value.npz");
    mkfifo(&fifo_value);
    let lines = vec![
        load_line(&fifo_model, "gguf", work.path()),
        load_line(&bare, "hf", work.path()),
        load_line(&gguf, "gguf", work.path()),
        RESET.into(),
        serde_json::json!({"op": "inject", "stage": "blk.0.out", "npz": fifo_value}).to_string(),
    ];
    let r = within(60, "serve given FIFOs", move || serve(&lines));
    assert!(
        err(&r[0]).contains("FIFO") && err(&r[0]).contains("fifo.gguf"),
        "{r:?}"
    );
    assert!(
        err(&r[1]).contains("is a directory without config.json")
            && err(&r[1]).contains("bare-dir"),
        "{r:?}"
    );
    assert!(r[2].error.is_none() && r[3].error.is_none(), "{r:?}");
    assert!(
        err(&r[4]).contains("FIFO") && err(&r[4]).contains("value.npz"),
        "{r:?}"
    );
}

/// Causes 2 and 11, the file side: FIFOs, `/dev/zero` and an oversized file as a report to `merge` and
/// `gate`, a cost table, a stage map, and a FIFO as `$GITHUB_STEP_SUMMARY` for `gate` and `run`: each
/// refused at once (exit 2), naming the file.
#[test]
fn fifos_devices_and_huge_files_as_inputs_are_refused_at_once() {
    let work = tempfile::tempdir().unwrap();
    let fifo = work.path().join("report.json");
    mkfifo(&fifo);
    let f = fifo.to_str().unwrap();
    let reports = work.path().join("reports");
    let r = reports.to_str().unwrap();
    for args in [
        &["merge", f, "--reports", r][..],
        &["gate", f][..],
        &[
            "run",
            "--model",
            "synth-llama",
            "--shard",
            "1/2",
            "--shard-costs",
            f,
            "--reports",
            r,
        ][..],
        &[
            "run",
            "--model",
            "synth-llama",
            "--engine-serve",
            "lockstep serve",
            "--stage-map",
            f,
            "--reports",
            r,
        ][..],
    ] {
        let (code, e) = lockstep_timed(args, &[], 60);
        assert_eq!(code, 2, "{args:?}: {e}");
        assert!(
            e.contains("FIFO") && e.contains("report.json"),
            "{args:?}: {e}"
        );
    }
    let summary = work.path().join("summary.md");
    mkfifo(&summary);
    for args in [
        &["gate", "no-such-report.json"][..],
        &[
            "run",
            "--model",
            "synth-llama",
            "--mode",
            "reference",
            "--simd",
            "off",
            "--reports",
            r,
        ][..],
    ] {
        let (code, e) = lockstep_timed(args, &[("GITHUB_STEP_SUMMARY", &summary)], 120);
        assert_eq!(code, 2, "{args:?}: {e}");
        assert!(
            e.contains("GITHUB_STEP_SUMMARY") && e.contains("FIFO") && e.contains("summary.md"),
            "{args:?}: {e}"
        );
    }
    // /dev/zero would be read until memory runs out; a sparse 300 MB report.json would be read whole
    let e = within(60, "/dev/zero as a cost table", || {
        format!(
            "{:#}",
            lockstep::shard::CostTable::load(Path::new("/dev/zero")).unwrap_err()
        )
    });
    assert!(
        e.contains("character device") && e.contains("/dev/zero"),
        "{e}"
    );
    let e = within(60, "/dev/zero as a stage map", || {
        format!(
            "{:#}",
            lockstep::protocol::stage_map::NameMap::load(Path::new("/dev/zero")).unwrap_err()
        )
    });
    assert!(e.contains("character device"), "{e}");
    let huge = work.path().join("huge").join("report.json");
    std::fs::create_dir(huge.parent().unwrap()).unwrap();
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    let e = format!("{:#}", lockstep::report::read_report(&huge).unwrap_err());
    assert!(
        e.contains("huge/report.json") && e.contains("at most"),
        "{e}"
    );
    let (code, e) = lockstep_timed(&["merge", huge.to_str().unwrap(), "--reports", r], &[], 60);
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("at most"), "{e}");
    assert!(!reports.exists() || std::fs::read_dir(&reports).unwrap().next().is_none());
}

/// Running (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        !st.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with(['Z', 'X']))
    })
}

/// The pid a helper wrote in `file`, waiting up to 10 s for it.
fn pid_in(file: &Path) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Ok(t) = std::fs::read_to_string(file) {
            if let Ok(p) = t.trim().parse() {
                return p;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no pid in {}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kill a process the test started if it survived (so a failing test leaves nothing behind).
fn reap(pid: i32) {
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
}

/// Cause 4: a helper that leaves the engine's process group and session (`setsid`) ends with the engine —
/// a one-shot engine that exits leaving it behind, and a session engine stopped while it runs.
#[test]
fn a_helper_that_calls_setsid_does_not_outlive_its_engine() {
    let work = tempfile::tempdir().unwrap();
    // the one-shot engine starts the helper in a new session, waits until it runs, and exits
    let pids = work.path().join("oneshot.pid");
    let mut c = Command::new("sh");
    c.arg("-c").arg(format!(
        "setsid sh -c 'echo $$ > {p}; exec sleep 1000' & while [ ! -s {p} ]; do sleep 0.02; done; echo done",
        p = pids.display()
    ));
    let out = lockstep::process::run_bounded(c, Duration::from_secs(30), work.path(), "tokenize")
        .unwrap();
    assert_eq!(out.stdout, b"done\n");
    let helper = pid_in(&pids);
    let survived = alive(helper);
    reap(helper);
    assert!(
        !survived,
        "the setsid helper {helper} outlived its one-shot engine"
    );

    // the session engine starts the helper, answers, and is stopped (dropped) while both run
    let pids = work.path().join("session.pid");
    let mut c = Command::new("sh");
    c.arg("-c").arg(format!(
        "setsid sh -c 'echo $$ > {p}; exec sleep 1000' & read l; echo ok; sleep 1000",
        p = pids.display()
    ));
    let mut ch = lockstep::process::LineChild::spawn(c, work.path(), "serve").unwrap();
    assert_eq!(ch.request("x", Duration::from_secs(30)).unwrap(), "ok");
    let helper = pid_in(&pids);
    drop(ch);
    let survived = alive(helper);
    reap(helper);
    assert!(
        !survived,
        "the setsid helper {helper} outlived its session engine"
    );
}
