//! Unit tests of the report modules.

use super::csv::Num;
use super::json::parse_value;
use super::markdown::{compact_ranges, fold_worst, stage_pattern};
use super::*;
use crate::compare::Phase;
use crate::format::*;
use std::collections::BTreeSet;
use std::path::Path;

#[test]
fn number_formats() {
    assert_eq!(fmt_fixed(0.9999, 8), "0.9999");
    assert_eq!(fmt_fixed(0.999123456789, 8), "0.99912346");
    assert_eq!(fmt_fixed(1.0, 8), "1");
    assert_eq!(fmt_fixed(-0.0000000001, 4), "0");
    assert_eq!(fmt_fixed(f64::INFINITY, 4), "inf");
    assert_eq!(fmt_sci(1e-3, 3), "1e-3");
    assert_eq!(fmt_sci(1.2345e-5, 3), "1.234e-5");
    assert_eq!(fmt_sci(0.0, 3), "0");
    assert_eq!(fmt_sci(f64::NEG_INFINITY, 3), "-inf");
    assert_eq!(fmt_cos(1.0), "1.00000000");
    assert_eq!(fmt_e3(1.96e-3), "1.960e-3");
    assert_eq!(fmt_e3(0.0), "0");
    assert_eq!(fmt_e3(f64::INFINITY), "inf");
    assert_eq!(Num::Sci(0.0).csv(), "0");
    assert_eq!(Num::Sci(1.5e-7).csv(), "1.5e-7");
    assert_eq!(Num::Fixed(0.25).csv(), "0.25");
    assert_eq!(Num::Fixed(f64::NAN).csv(), "nan");
    assert_eq!(
        compact_ranges(&[0, 1, 2, 3, 5, 7, 8, 9].into_iter().collect()),
        "0..3,5,7..9"
    );
    assert_eq!(
        stage_pattern("blk.12.attn_proj"),
        ("blk.{N}.attn_proj".to_string(), Some(12))
    );
    assert_eq!(
        stage_pattern("output_norm"),
        ("output_norm".to_string(), None)
    );
}

#[test]
fn environment_detection_never_fails_and_run_ids_have_their_shape() {
    let env = Environment::detect(3, Path::new("/nonexistent/manifest.json"));
    assert_eq!(env.threads, 3);
    assert_eq!(env.golden_manifest_sha256, "unknown");
    assert_eq!(env.lockstep_version, env!("CARGO_PKG_VERSION"));
    assert!(!env.cpu_model.is_empty() && !env.os.is_empty() && !env.rustc.is_empty());
    assert!(env
        .cpu_flags
        .iter()
        .all(|f| SIMD_FLAGS.contains(&f.as_str())));
    let id = new_run_id();
    let parts: Vec<&str> = id.splitn(3, '-').collect();
    assert_eq!(parts.len(), 3, "{id}");
    assert!(parts[0].len() == 8 && parts[1].len() == 6, "{id}");
    assert!(
        parts[0]
            .bytes()
            .chain(parts[1].bytes())
            .all(|b| b.is_ascii_digit()),
        "{id}"
    );
    assert!(!parts[2].is_empty(), "{id}");
    // ids made in the same second (here: the same microsecond, in a loop) never collide
    let ids: BTreeSet<String> = (0..1000).map(|_| new_run_id()).collect();
    assert_eq!(ids.len(), 1000);
}

#[test]
fn stale_partial_directories_are_removed_and_fresh_ones_kept() {
    let root = tempfile::tempdir().unwrap();
    let stale = root
        .path()
        .join(".20200101-000000-abc-000000.partial-AbCdEf");
    let fresh = root
        .path()
        .join(".20991231-000000-abc-000000.partial-XyZ123");
    let other = root.path().join(".hidden-but-not-partial");
    for d in [&stale, &fresh, &other] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("report.json"), "{").unwrap();
    }
    let old = std::time::SystemTime::now() - STALE_PARTIAL_AGE * 2;
    for d in [&stale, &other] {
        std::fs::File::open(d).unwrap().set_modified(old).unwrap();
    }
    assert_eq!(clean_stale_partials(root.path()), vec![stale.clone()]);
    assert!(!stale.exists() && fresh.exists() && other.exists());
}

#[test]
fn an_unwritable_reports_directory_is_found_before_the_run() {
    let root = tempfile::tempdir().unwrap();
    check_reports_dir(&root.path().join("new/reports")).unwrap();
    let file = root.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let e = format!(
        "{:#}",
        check_reports_dir(&file.join("reports")).unwrap_err()
    );
    assert!(e.contains("a-file/reports"), "{e}");
}

#[test]
fn utc_dates() {
    assert_eq!(fmt_utc(0), "1970-01-01 00:00:00 UTC");
    assert_eq!(fmt_utc(951_782_400), "2000-02-29 00:00:00 UTC");
    assert_eq!(fmt_utc(1_795_385_701), "2026-11-22 22:15:01 UTC");
}

#[test]
fn non_finite_floats_round_trip_through_json() {
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct T {
        a: f64,
        b: Vec<f64>,
        c: Option<f64>,
        d: Option<f64>,
        s: String,
        m: BTreeMap<String, f32>,
        p: Phase,
    }
    let t = T {
        a: f64::INFINITY,
        b: vec![1.5, f64::NEG_INFINITY, 0.1],
        c: Some(f64::INFINITY),
        d: None,
        s: "inf".into(),
        m: [("x".to_string(), f32::INFINITY)].into_iter().collect(),
        p: Phase::Decode,
    };
    let text = to_json_pretty(&t).unwrap();
    assert!(
        text.contains("\"a\": \"inf\"") && text.contains("\"-inf\""),
        "{text}"
    );
    assert_eq!(from_json::<T>(&text).unwrap(), t);
    let nan: Vec<f64> = from_json(&to_json_pretty(&vec![f64::NAN]).unwrap()).unwrap();
    assert!(nan[0].is_nan());
    // A string field holding "inf" stays a string; a float field holding another string is an error.
    assert!(from_json::<Vec<f64>>("[\"infinity\"]").is_err());
}

#[test]
fn json_reads_floats_bit_for_bit_and_refuses_bad_documents() {
    let xs = [
        0.00013416407864998739,
        0.9999988333333333,
        2.4999999999999998e-6,
        1e-300,
        5e-324,
        f64::MAX,
        -0.0,
        0.1,
    ];
    let text = serde_json::to_string(&xs).unwrap();
    let back: Vec<f64> = from_json(&text).unwrap();
    assert_eq!(
        back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    for bad in [
        "",
        "[1,]",
        "{\"a\" 1}",
        "01",
        "1.",
        "1e",
        "\"\\x\"",
        "\"\\ud800\"",
        "[1] x",
        "\"a",
        "nul",
        "1e999",
        "\"\\u+12a\"",
    ] {
        assert!(parse_value(bad).is_err(), "{bad:?} must not parse");
    }
    assert!(parse_value(&"[".repeat(300))
        .unwrap_err()
        .to_string()
        .contains("recursion limit"));
    assert!(parse_value("[1,\n 2,\n x]")
        .unwrap_err()
        .to_string()
        .contains("line 3 column 2"));
}

#[test]
fn every_definition_names_a_metric_of_metrics_rs_or_the_gate() {
    let doc = include_str!("../metrics.rs");
    let defs = metric_definitions();
    for k in [
        "cosine",
        "max_abs",
        "mean_abs",
        "rmse",
        "nmse",
        "bit_exact",
        "kl",
        "top1",
        "margin",
        "entropy",
        "dp_top",
    ] {
        assert!(defs.contains_key(k), "{k}");
        assert!(
            doc.contains(&format!("**{k}**")),
            "metrics.rs no longer defines **{k}**"
        );
    }
}

#[test]
fn the_rollup_keeps_the_worst_value_and_a_nan_wins() {
    let fold = |values: &[Option<f64>], larger_is_worse: bool| {
        let mut acc = None;
        for v in values {
            fold_worst(&mut acc, *v, larger_is_worse);
        }
        acc
    };
    assert_eq!(fold(&[], true), None);
    assert_eq!(fold(&[None, None], false), None, "no cell has the metric");
    assert_eq!(
        fold(&[Some(1e-6), None, Some(3e-3), Some(2e-4)], true),
        Some(3e-3)
    );
    assert_eq!(
        fold(&[Some(1.0), Some(0.8), None, Some(0.9)], false),
        Some(0.8)
    );
    for values in [
        [Some(f64::NAN), Some(0.5), Some(2.0)],
        [Some(0.5), Some(2.0), Some(f64::NAN)],
    ] {
        assert!(fold(&values, true).unwrap().is_nan());
        assert!(fold(&values, false).unwrap().is_nan());
    }
}
