//! `.github/workflows/lockstep.yml`, the workflow users copy, checked without GitHub: it is YAML (parsed
//! with yaml-rust2); its jobs, steps and `needs` are well formed (GitHub's workflow schema: every step
//! has exactly one of `uses` and `run`, every action is pinned to a version, every `needs` names a job);
//! every job has `timeout-minutes` and the workflow a `concurrency` group; `test` runs ci/test.sh; one job
//! (`models`) fetches the models and saves their cache, keyed by models.toml's hash, which the others restore
//! with restore-keys; `merge` runs only after a successful build; the site is published from the restored
//! history with a bench, checked to have a bench trend, and deployed to Pages; artifacts are kept more than a
//! day; the shard list and the `--shard I/N` count agree; and every `lockstep` command it runs parses with
//! lockstep's own command line (clap), so a renamed flag fails here, not on a runner. (actionlint would check
//! more; it does not install from a package registry here: its PyPI package builds by downloading a binary.)
//! The steps themselves run in order under ci/workflow-steps.py (the ignored test at the end).

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::Parser;
use yaml_rust2::{Yaml, YamlLoader};

mod common;
use common::root;

fn workflow() -> Yaml {
    let p = root().join(".github/workflows/lockstep.yml");
    let text = std::fs::read_to_string(&p).unwrap();
    let mut docs =
        YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert_eq!(docs.len(), 1);
    docs.remove(0)
}

fn key<'a>(y: &'a Yaml, k: &str) -> &'a Yaml {
    &y[k]
}

fn map_keys(y: &Yaml) -> Vec<String> {
    y.as_hash()
        .unwrap_or_else(|| panic!("not a mapping: {y:?}"))
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect()
}

/// The `lockstep` command lines of a `run:` script: lines starting with `bin/lockstep`, continuation
/// backslashes joined, `${{ matrix.shard }}` replaced by `shard`, the workflow's `env` variables by their
/// values and `"$baseline"` (the bench's baseline binary) by a path.
fn lockstep_commands(script: &str, shard: &str, env: &Yaml) -> Vec<Vec<String>> {
    let mut joined = script
        .replace("\\\n", " ")
        .replace("\"$baseline\"", "bin/lockstep");
    for k in map_keys(env) {
        let v = env[k.as_str()].as_str().unwrap_or_default().to_string();
        joined = joined.replace(&format!("${k}"), &v);
    }
    joined
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("bin/lockstep "))
        .map(|l| {
            l.replace("${{ matrix.shard }}", shard)
                .split_whitespace()
                .map(|w| w.replace("bin/lockstep", "lockstep"))
                .collect()
        })
        .collect()
}

/// The `needs` of a job, as a list (GitHub takes a string or a list).
fn needs(job: &Yaml) -> Vec<String> {
    match &job["needs"] {
        Yaml::BadValue => Vec::new(),
        Yaml::String(n) => vec![n.clone()],
        Yaml::Array(a) => a.iter().map(|n| n.as_str().unwrap().to_string()).collect(),
        other => panic!("needs {other:?}"),
    }
}

/// The steps of a job.
fn steps<'a>(jobs: &'a Yaml, job: &str) -> &'a [Yaml] {
    jobs[job]["steps"]
        .as_vec()
        .unwrap_or_else(|| panic!("job {job}: steps"))
}

/// The steps of a job that use `action` (`actions/cache/restore`, …; any version).
fn uses<'a>(jobs: &'a Yaml, job: &str, action: &str) -> Vec<&'a Yaml> {
    steps(jobs, job)
        .iter()
        .filter(|s| {
            s["uses"]
                .as_str()
                .is_some_and(|u| u.split('@').next() == Some(action))
        })
        .collect()
}

/// Every `run:` script of a job, joined.
fn scripts(jobs: &Yaml, job: &str) -> String {
    steps(jobs, job)
        .iter()
        .filter_map(|s| s["run"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_workflow_is_well_formed_and_its_lockstep_commands_parse() {
    let w = workflow();
    for k in ["name", "on", "jobs", "concurrency"] {
        assert!(!key(&w, k).is_badvalue(), "top-level `{k}` missing");
    }
    assert!(
        w["concurrency"]["group"].as_str().is_some(),
        "concurrency.group"
    );
    let jobs = key(&w, "jobs");
    let names: BTreeSet<String> = map_keys(jobs).into_iter().collect();
    assert_eq!(
        names,
        ["build", "gate", "merge", "models", "pages", "shard", "test"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    let mut commands = Vec::new();
    for name in &names {
        let job = &jobs[name.as_str()];
        assert!(job["runs-on"].as_str().is_some(), "job {name}: runs-on");
        let t = job["timeout-minutes"].as_i64();
        assert!(
            t.is_some_and(|t| (1..=360).contains(&t)),
            "job {name}: timeout-minutes (1..=360, GitHub's limit) is {:?}",
            job["timeout-minutes"]
        );
        for n in needs(job) {
            assert!(names.contains(&n), "job {name} needs unknown {n}");
        }
        let steps = steps(jobs, name);
        assert!(!steps.is_empty());
        for (i, s) in steps.iter().enumerate() {
            let uses = s["uses"].as_str();
            let run = s["run"].as_str();
            assert!(
                uses.is_some() != run.is_some(),
                "job {name} step {i}: exactly one of uses/run"
            );
            if let Some(u) = uses {
                let (action, version) = u.split_once('@').unwrap_or_else(|| panic!("{u} unpinned"));
                assert!(action.contains('/') && version.starts_with('v'), "{u}");
            }
            if let Some(r) = run {
                let shard = if name == "shard" { "2" } else { "" };
                commands.extend(lockstep_commands(r, shard, &w["env"]));
            }
            if uses.is_some_and(|u| u.starts_with("actions/upload-artifact@")) {
                let days = s["with"]["retention-days"].as_i64();
                assert!(
                    days.is_some_and(|d| d > 1),
                    "job {name} step {i}: an artifact kept more than a day (retention-days {days:?})"
                );
            }
        }
    }

    // the order: build, models, then the test suite and the shards, merge only after a successful build
    assert_eq!(needs(&jobs["models"]), ["build"]);
    assert_eq!(needs(&jobs["test"]), ["models"]);
    assert!(needs(&jobs["shard"]).contains(&"models".to_string()));
    let merge = &jobs["merge"];
    assert!(
        needs(merge).contains(&"build".to_string()) && needs(merge).contains(&"shard".to_string())
    );
    let cond = merge["if"].as_str().unwrap_or_default();
    assert!(
        cond.contains("needs.build.result == 'success'"),
        "merge runs only after a successful build: if: {cond}"
    );
    assert!(
        scripts(jobs, "test")
            .lines()
            .any(|l| l.trim() == "ci/test.sh"),
        "the test job runs ci/test.sh"
    );

    // the shard list is 1..=N and every --shard says /N
    let shard = &jobs["shard"];
    let list: Vec<i64> = shard["strategy"]["matrix"]["shard"]
        .as_vec()
        .expect("strategy.matrix.shard list")
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let n = list.len() as i64;
    assert_eq!(list, (1..=n).collect::<Vec<_>>());
    assert!(n >= 2);
    let shard_args: Vec<&String> = commands
        .iter()
        .flat_map(|c| c.windows(2).filter(|w| w[0] == "--shard").map(|w| &w[1]))
        .collect();
    assert!(!shard_args.is_empty(), "no --shard in the shard job");
    for a in shard_args {
        assert_eq!(a, &format!("2/{n}"), "--shard must count {n} shards");
    }
    assert_eq!(
        shard["strategy"]["fail-fast"].as_bool(),
        Some(false),
        "one failing shard must not cancel the others"
    );

    // the model cache: made and saved by the models job only, restored by every job that runs models, one
    // key (models.toml's hash) with restore-keys
    assert!(key(&w, "env")["LOCKSTEP_CACHE"].as_str().is_some());
    let model_cache = |s: &Yaml| {
        s["with"]["path"]
            .as_str()
            .is_some_and(|p| p.contains("LOCKSTEP_CACHE"))
    };
    for name in &names {
        let caches: Vec<&Yaml> = steps(jobs, name)
            .iter()
            .filter(|s| {
                s["uses"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("actions/cache"))
                    && model_cache(s)
            })
            .collect();
        let saves = caches
            .iter()
            .filter(|s| {
                s["uses"]
                    .as_str()
                    .is_some_and(|u| !u.starts_with("actions/cache/restore@"))
            })
            .count();
        assert_eq!(
            saves,
            usize::from(name == "models"),
            "job {name}: only the models job saves the model cache"
        );
        for s in &caches {
            let k = s["with"]["key"].as_str().unwrap_or_default();
            assert!(
                k.contains("hashFiles('models.toml')"),
                "job {name}: cache key {k}"
            );
            if s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("actions/cache/restore@"))
            {
                assert_eq!(
                    s["with"]["restore-keys"].as_str(),
                    Some("lockstep-models-"),
                    "job {name}: restore-keys, so that a models.toml edit starts from the last cache"
                );
            }
        }
        let runs_models = ["test", "shard", "merge"].contains(&name.as_str());
        assert_eq!(
            caches.iter().any(|s| s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("actions/cache/restore@"))),
            runs_models || name == "models",
            "job {name}: restores the model cache"
        );
    }
    assert!(scripts(jobs, "models").contains("ci/fetch-models.sh"));
    for name in &names {
        if name != "models" {
            assert!(
                !scripts(jobs, name).contains("fetch-models"),
                "job {name} fetches models"
            );
        }
    }

    // run, merge, bench, publish, gate with --junit; each parses with lockstep's command line
    let subcommands: BTreeSet<&str> = commands.iter().map(|c| c[1].as_str()).collect();
    assert_eq!(
        subcommands,
        ["bench", "gate", "merge", "publish", "run"]
            .into_iter()
            .collect()
    );
    for c in &commands {
        // shell globs stand for files: any path parses
        lockstep::cli::Cli::try_parse_from(c)
            .unwrap_or_else(|e| panic!("`{}` does not parse: {e}", c.join(" ")));
    }
    assert!(commands
        .iter()
        .any(|c| c[1] == "gate" && c.contains(&"--junit".to_string())));

    // the site: built from the history (restored and saved) with a bench, bench.html checked, deployed
    let merge_scripts = scripts(jobs, "merge");
    assert!(merge_scripts.contains("bin/lockstep publish history/reports --out site"));
    assert!(merge_scripts.contains("test -s site/bench.html"));
    assert!(
        uses(jobs, "merge", "actions/cache/restore")
            .iter()
            .any(|s| s["with"]["path"].as_str() == Some("history")),
        "the history is restored"
    );
    assert!(
        uses(jobs, "merge", "actions/cache/save")
            .iter()
            .any(|s| s["with"]["path"].as_str() == Some("history")),
        "the history is saved"
    );
    let pages = uses(jobs, "merge", "actions/upload-pages-artifact");
    assert_eq!(pages.len(), 1);
    assert_eq!(pages[0]["with"]["path"].as_str(), Some("site/"));
    assert_eq!(uses(jobs, "pages", "actions/deploy-pages").len(), 1);
    assert_eq!(
        jobs["pages"]["permissions"]["pages"].as_str(),
        Some("write")
    );
    assert_eq!(
        jobs["pages"]["permissions"]["id-token"].as_str(),
        Some("write")
    );

    // JUnit and the report are uploaded
    let uploads: Vec<String> = names
        .iter()
        .flat_map(|j| uses(jobs, j, "actions/upload-artifact"))
        .map(|s| s["with"]["path"].as_str().unwrap().to_string())
        .collect();
    for want in ["junit.xml", "merged/"] {
        assert!(
            uploads.iter().any(|u| u == want),
            "{want} not uploaded: {uploads:?}"
        );
    }
}

/// The workflow's jobs run on this machine, every step in order (ci/workflow-steps.py: GitHub's variables
/// and the actions it uses emulated; `--quick`: one seeded model, the models job's cache seeded from the
/// model cache, ci/test.sh syntax-checked instead of run). Minutes: a release build and a bench.
#[test]
#[ignore = "builds lockstep and runs every job of the workflow: run by ci/test.sh"]
fn the_workflow_steps_run_in_order() {
    let out = std::process::Command::new("python3")
        .arg(root().join("ci/workflow-steps.py"))
        .arg("--quick")
        // the clone's build reuses this checkout's compiled dependencies (ci/test.sh built them in release
        // for the fetch step): minutes less than a cold release build
        .env(
            "CARGO_TARGET_DIR",
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| root().join("target")),
        )
        .current_dir(root())
        .output()
        .expect("python3 runs ci/workflow-steps.py");
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}{err}");
    assert!(
        text.contains(
            "jobs: build success, models success, test success, shard success, merge success, gate success, pages success"
        ),
        "{text}"
    );
    assert!(
        text.contains("cache: restored lockstep-models-earlier-run (restore-key)"),
        "{text}"
    );
    assert!(text.contains("deployed: file://"), "{text}");
}
