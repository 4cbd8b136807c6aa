//! `lockstep run --shard I/N` + `lockstep merge` on the tiny seeded models (written in the cache on first
//! use, no download): three shards merged give the whole run's report — verdicts, metrics, first divergent
//! stages, findings, probes, output digests — bit for bit, but for run ids and times.

use std::path::Path;

use anyhow::Result;
use lockstep::engine::{Engine, LockstepEngine};
use lockstep::gate::Thresholds;
use lockstep::matrix::{Cell, Filters};
use lockstep::report::{read_report, to_json_pretty, Report};
use lockstep::run::{run_with, RunOptions};
use lockstep::shard::{merge, merge_files, ShardSpec};
use lockstep_engine::gguf::GgufFile;
use lockstep_engine::{Model, Simd};

mod common;
use common::root;

const MODELS: &[&str] = &[
    "synth-llama",
    "synth-qwen2",
    "synth-gemma3",
    "synth-qwen2-q4_k",
];

fn options(reports: &Path, shard: Option<ShardSpec>) -> RunOptions {
    RunOptions {
        golden_dir: root().join("golden"),
        matrix: root().join("ci/matrix.toml"),
        thresholds: root().join("ci/thresholds.toml"),
        reports_root: reports.to_path_buf(),
        filters: Filters {
            model: MODELS.iter().map(|m| m.to_string()).collect(),
            // the full tier: the shards keep every SIMD twin with its scalar cell
            full: true,
            ..Filters::default()
        },
        external: None,
        force_external: false,
        progress: false,
        threads: rayon::current_num_threads(),
        ggml_target: None,
        floors: root().join("ci/floors.json"),
        shard: shard.map(|s| (s, None)),
        select: Default::default(),
        serve: None,
    }
}

/// Patch `llama.attention.layer_norm_rms_epsilon` in a GGUF's bytes (key, u32 type 6 = F32, value).
fn with_eps(mut bytes: Vec<u8>, eps: f32) -> Vec<u8> {
    let key = b"llama.attention.layer_norm_rms_epsilon";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("eps key in the file")
        + key.len();
    assert_eq!(u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()), 6);
    bytes[at + 4..at + 8].copy_from_slice(&eps.to_le_bytes());
    bytes
}

/// Our engine; on synth-llama with a wrong RMSNorm epsilon, so that its cells fail with a first divergent
/// stage, a bisect finding and (reference mode) a rounding probe.
fn run_one(reports: &Path, shard: Option<ShardSpec>) -> Report {
    let opts = options(reports, shard);
    let mut factory = |cell: &Cell, model: &Path, _: &str| -> Result<Box<dyn Engine>> {
        let simd = Simd::parse(&cell.simd)?;
        if cell.model == "synth-llama" {
            let bytes = with_eps(std::fs::read(model)?, 1e-2);
            let m = Model::from_gguf(GgufFile::from_bytes(bytes, "broken-eps.gguf")?)?;
            Ok(Box::new(
                LockstepEngine::from_model(m, model.to_path_buf()).with_simd(simd),
            ))
        } else {
            Ok(Box::new(LockstepEngine::load(model)?.with_simd(simd)))
        }
    };
    run_with(&opts, &mut factory).expect("the run succeeds").1
}

/// The report with run ids and times cleared, as JSON (NaN and infinities as strings, floats exact).
fn normalized(r: &Report) -> String {
    let mut r = r.clone();
    r.run_id.clear();
    r.created_unix = 0;
    r.merged_from.clear();
    r.shard = None;
    for c in &mut r.cells {
        c.seconds = None;
        c.speed.prefill_seconds = 0.0;
        c.speed.decode_seconds = 0.0;
    }
    to_json_pretty(&r).unwrap()
}

#[test]
fn three_shards_merged_equal_the_whole_run() {
    let dir = tempfile::tempdir().unwrap();
    let whole = run_one(&dir.path().join("whole"), None);
    let shards: Vec<Report> = (1..=3)
        .map(|i| {
            run_one(
                &dir.path().join("shards"),
                Some(ShardSpec { index: i, count: 3 }),
            )
        })
        .collect();

    // the whole run is not trivial: failing cells with a first divergent stage and a finding
    let failing: Vec<_> = whole.cells.iter().filter(|c| !c.verdict.pass).collect();
    assert!(!failing.is_empty(), "the broken epsilon must fail cells");
    assert!(failing.iter().any(|c| c.verdict.first_divergent.is_some()));
    assert!(whole.cells.iter().any(|c| c.verdict.pass));
    // each shard ran a part, the parts are disjoint and cover the matrix
    let mut ids: Vec<String> = Vec::new();
    for s in &shards {
        assert!(!s.cells.is_empty(), "shard {:?} is empty", s.shard);
        assert!(s.cells.len() < whole.cells.len());
        ids.extend(s.cells.iter().map(|c| c.cell.id()));
        let info = s.shard.as_ref().unwrap();
        assert_eq!(
            info.matrix_cells,
            whole.cells.iter().map(|c| c.cell.id()).collect::<Vec<_>>()
        );
    }
    ids.sort();
    let mut want: Vec<String> = whole.cells.iter().map(|c| c.cell.id()).collect();
    want.sort();
    assert_eq!(ids, want);

    // merged (in any order) = the whole run, but for ids and times
    let mut shuffled = shards.clone();
    shuffled.rotate_left(1);
    let merged = merge(shuffled, &thresholds()).unwrap();
    assert_eq!(merged.merged_from.len(), 3);
    assert!(merged.shard.is_none());
    assert_eq!(normalized(&merged), normalized(&whole));

    // the same through the files `lockstep merge` reads and writes
    let (mdir, written) = merge_files(
        &std::fs::read_dir(dir.path().join("shards"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect::<Vec<_>>(),
        &dir.path().join("merged"),
        &root().join("ci/thresholds.toml"),
    )
    .unwrap();
    assert_eq!(normalized(&written), normalized(&whole));
    let back = read_report(&mdir.join("report.json")).unwrap();
    assert_eq!(normalized(&back), normalized(&whole));

    // a missing shard, a shard given twice, a report that is no shard: refused, naming them
    let e = format!(
        "{:#}",
        merge(shards[..2].to_vec(), &thresholds()).unwrap_err()
    );
    assert!(e.contains("3/3") && e.contains("missing"), "{e}");
    let e = format!(
        "{:#}",
        merge(
            vec![shards[0].clone(), shards[0].clone(), shards[1].clone()],
            &thresholds()
        )
        .unwrap_err()
    );
    assert!(e.contains("given twice"), "{e}");
    let e = format!(
        "{:#}",
        merge(vec![whole.clone()], &thresholds()).unwrap_err()
    );
    assert!(
        e.contains("not a shard") && e.contains(&whole.run_id),
        "{e}"
    );
    // shards of another matrix
    let mut other = shards[2].clone();
    other.shard.as_mut().unwrap().matrix_cells.pop();
    let e = format!(
        "{:#}",
        merge(
            vec![shards[0].clone(), shards[1].clone(), other],
            &thresholds()
        )
        .unwrap_err()
    );
    assert!(e.contains("matrix"), "{e}");

    // a shard whose failing cell was edited to pass, its metrics unchanged (issue 47, cause 7): every
    // cell is judged again, and the edited one is refused, naming the shard and the cell
    let i = shards
        .iter()
        .position(|r| r.cells.iter().any(|c| !c.verdict.pass))
        .expect("the broken-eps cells fail in some shard");
    let mut tampered = shards.clone();
    let cell = tampered[i]
        .cells
        .iter_mut()
        .find(|c| !c.verdict.pass)
        .unwrap();
    cell.verdict.pass = true;
    cell.verdict.failures.clear();
    let id = cell.cell.id();
    let e = format!("{:#}", merge(tampered.clone(), &thresholds()).unwrap_err());
    assert!(
        e.contains(&id) && e.contains(&tampered[i].run_id) && e.contains("recorded verdict"),
        "{e}"
    );
    // the same through `lockstep merge`: exit 2, nothing merged
    let files = dir.path().join("tampered");
    let paths: Vec<String> = tampered
        .iter()
        .map(|r| {
            let p = files.join(&r.run_id).join("report.json");
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, to_json_pretty(r).unwrap()).unwrap();
            p.display().to_string()
        })
        .collect();
    let merged = dir.path().join("merged-tampered");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .arg("merge")
        .args(&paths)
        .arg("--reports")
        .arg(&merged)
        .arg("--thresholds")
        .arg(root().join("ci/thresholds.toml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&id) && stderr.contains("recorded verdict"),
        "{stderr}"
    );
    assert!(
        !merged.exists() || std::fs::read_dir(&merged).unwrap().next().is_none(),
        "nothing merged"
    );
    // `lockstep gate` of the edited shard: refused too, not gated as passing
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .arg("gate")
        .arg(&paths[i])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&id) && stderr.contains("recorded verdict"),
        "{stderr}"
    );
    // a recorded cell threshold loosened to match the edit is refused too
    let mut loosened = shards.clone();
    let t = loosened[i].cells[0]
        .thresholds
        .as_mut()
        .expect("cells record their thresholds");
    t.max_mean_kl = t.max_mean_kl * 2.0 + 1.0;
    let e = format!("{:#}", merge(loosened, &thresholds()).unwrap_err());
    assert!(e.contains("recorded thresholds"), "{e}");
}

fn thresholds() -> Thresholds {
    Thresholds::load(&root().join("ci/thresholds.toml")).unwrap()
}

#[test]
fn a_shard_with_nothing_to_run_writes_an_empty_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path(), Some(ShardSpec { index: 7, count: 7 }));
    opts.filters.model = vec!["synth-llama".into()];
    opts.filters.mode = vec!["reference".into()];
    opts.filters.oracle = vec!["llama.cpp-f32kv".into()];
    // one unit (reference against llama.cpp, its SIMD twins): shards 2..7 are empty
    let (d, r) = lockstep::run::run(&opts).unwrap();
    assert!(r.cells.is_empty());
    assert_eq!(r.shard.as_ref().unwrap().matrix_cells.len(), 2);
    assert!(d.join("report.md").is_file());
}
