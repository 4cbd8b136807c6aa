//! `.github/workflows/lockstep.yml`, the workflow users copy, checked without GitHub: it is YAML (parsed
//! with yaml-rust2); its jobs, steps and `needs` are well formed (GitHub's workflow schema: every step
//! has exactly one of `uses` and `run`, every action is pinned to a version, every `needs` names a job);
//! the shard list and the `--shard I/N` count agree; the model cache is keyed by models.toml's hash; and
//! every `lockstep` command it runs parses with lockstep's own command line (clap), so a renamed flag
//! fails here, not on a runner. (actionlint would check more; it does not install from a package
//! registry here: its PyPI package builds by downloading a binary.)

use std::collections::BTreeSet;

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
/// backslashes joined, `${{ matrix.shard }}` replaced by `shard`.
fn lockstep_commands(script: &str, shard: &str) -> Vec<Vec<String>> {
    let joined = script.replace("\\\n", " ");
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

#[test]
fn the_workflow_is_well_formed_and_its_lockstep_commands_parse() {
    let w = workflow();
    for k in ["name", "on", "jobs"] {
        assert!(!key(&w, k).is_badvalue(), "top-level `{k}` missing");
    }
    let jobs = key(&w, "jobs");
    let names: BTreeSet<String> = map_keys(jobs).into_iter().collect();
    assert_eq!(
        names,
        ["build", "merge", "shard"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    let mut commands = Vec::new();
    for name in &names {
        let job = &jobs[name.as_str()];
        assert!(job["runs-on"].as_str().is_some(), "job {name}: runs-on");
        match &job["needs"] {
            Yaml::BadValue => {}
            Yaml::String(n) => assert!(names.contains(n), "job {name} needs unknown {n}"),
            other => panic!("job {name}: needs {other:?}"),
        }
        let steps = job["steps"]
            .as_vec()
            .unwrap_or_else(|| panic!("job {name}: steps"));
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
                commands.extend(lockstep_commands(r, shard));
            }
        }
    }

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

    // the model cache keyed by models.toml
    let keyed = shard["steps"].as_vec().unwrap().iter().any(|s| {
        s["uses"]
            .as_str()
            .is_some_and(|u| u.starts_with("actions/cache@"))
            && s["with"]["key"]
                .as_str()
                .is_some_and(|k| k.contains("hashFiles('models.toml')"))
            && s["with"]["path"]
                .as_str()
                .is_some_and(|p| p.contains("LOCKSTEP_CACHE"))
    });
    assert!(
        keyed,
        "the shard job caches $LOCKSTEP_CACHE by models.toml's hash"
    );
    assert!(key(&w, "env")["LOCKSTEP_CACHE"].as_str().is_some());

    // run, merge, publish, gate with --junit; each parses with lockstep's command line
    let subcommands: BTreeSet<&str> = commands.iter().map(|c| c[1].as_str()).collect();
    assert_eq!(
        subcommands,
        ["gate", "merge", "publish", "run"].into_iter().collect()
    );
    for c in &commands {
        // shell globs stand for files: any path parses
        lockstep::cli::Cli::try_parse_from(c)
            .unwrap_or_else(|e| panic!("`{}` does not parse: {e}", c.join(" ")));
    }
    assert!(commands
        .iter()
        .any(|c| c[1] == "gate" && c.contains(&"--junit".to_string())));

    // JUnit, the report and the site are uploaded
    let uploads: Vec<String> = jobs["merge"]["steps"]
        .as_vec()
        .unwrap()
        .iter()
        .filter(|s| {
            s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("actions/upload-artifact@"))
        })
        .map(|s| s["with"]["path"].as_str().unwrap().to_string())
        .collect();
    for want in ["junit.xml", "merged/", "site/"] {
        assert!(
            uploads.iter().any(|u| u == want),
            "{want} not uploaded: {uploads:?}"
        );
    }
}
