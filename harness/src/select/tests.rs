use super::*;
use lockstep_engine::NumericsMode;

fn cell(model: &str, prompt: &str, oracle: &str) -> Cell {
    Cell {
        model: model.into(),
        prompt: prompt.into(),
        quant: "F32".into(),
        mode: NumericsMode::Ggml,
        simd: "off".into(),
        oracle: oracle.into(),
        engine: "lockstep".into(),
    }
}

const TODAY: (i64, u32, u32) = (2026, 11, 29);

#[test]
fn patterns_are_substrings_unless_they_hold_a_glob_character() {
    let id = "synth-llama/synth/F32/ggml/simd-off/llama.cpp-f32kv/lockstep";
    let sub = CellPattern::parse("llama/synth").unwrap();
    assert!(sub.matches(id));
    assert!(!CellPattern::parse("qwen").unwrap().matches(id));
    // a glob is matched against the whole id, `*` crossing `/`
    assert!(CellPattern::parse("synth-*/ggml/*").unwrap().matches(id));
    assert!(!CellPattern::parse("synth-*/reference/*")
        .unwrap()
        .matches(id));
    assert!(!CellPattern::parse("synth-llama")
        .unwrap()
        .matches("synth-qwen2/x"));
    // an anchored glob must match all of it: the key (the id without the engine) is also tried
    assert!(CellPattern::parse("*/llama.cpp-f32kv").unwrap().matches(id));
    assert!(!CellPattern::parse("llama.cpp-f32kv*").unwrap().matches(id));
    assert!(CellPattern::parse("*/{ggml,reference}/*")
        .unwrap()
        .matches(id));
    assert!(CellPattern::parse("  ").is_err());
    let e = CellPattern::parse("a[b").unwrap_err();
    assert!(format!("{e:#}").contains("not a valid glob"), "{e:#}");
}

#[test]
fn filtering_keeps_cells_matching_any_pattern_and_refuses_a_pattern_matching_none() {
    let cells = vec![
        cell("synth-llama", "synth", "llama.cpp-f32kv"),
        cell("synth-llama", "synth", "transformers-f32"),
        cell("synth-qwen2", "synth", "llama.cpp-f32kv"),
    ];
    let p = |s: &str| CellPattern::parse(s).unwrap();
    let kept = filter_by_patterns(cells.clone(), &[p("transformers"), p("synth-qwen2/*")]).unwrap();
    let models: Vec<(&str, &str)> = kept
        .iter()
        .map(|c| (c.model.as_str(), c.oracle.as_str()))
        .collect();
    assert_eq!(
        models,
        [
            ("synth-llama", "transformers-f32"),
            ("synth-qwen2", "llama.cpp-f32kv")
        ]
    );
    assert_eq!(filter_by_patterns(cells.clone(), &[]).unwrap().len(), 3);
    let e = filter_by_patterns(cells, &[p("transformers"), p("gemma")]).unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("\"gemma\"") && e.contains("--list"), "{e}");
}

#[test]
fn the_key_drops_the_engine() {
    assert_eq!(
        cell_key("m/p/Q/ggml/simd-off/o/numpy-example"),
        "m/p/Q/ggml/simd-off/o"
    );
    assert_eq!(cell_key("plain"), "plain");
}

#[test]
fn expected_failures_parse_and_refuse_what_would_hide_a_failure() {
    let ok = r#"
[[expected]]
cell = "synth-llama/*/transformers-f32/*"
reason = "cross-oracle distance, issue 99"
expires = 2026-11-29
"#;
    let x = ExpectedFailures::parse(ok, "x.toml", TODAY).unwrap();
    let e = x
        .find("synth-llama/synth/F32/ggml/simd-off/transformers-f32/lockstep")
        .unwrap();
    assert_eq!(e.reason, "cross-oracle distance, issue 99");
    assert_eq!(e.expires, "2026-11-29");
    assert!(x
        .find("synth-llama/synth/F32/ggml/simd-off/llama.cpp-f32kv/lockstep")
        .is_none());
    assert!(ExpectedFailures::parse("", "x.toml", TODAY)
        .unwrap()
        .is_empty());

    // the day after its date, an entry stops the run
    let e = ExpectedFailures::parse(ok, "x.toml", (2026, 11, 30)).unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("x.toml")
            && e.contains("entry 1")
            && e.contains("expired on 2026-11-29")
            && e.contains("issue 99"),
        "{e}"
    );
    for (bad, says) in [
        (
            ok.replace("issue 99", "")
                .replace("cross-oracle distance, ", ""),
            "`reason` is empty",
        ),
        (
            ok.replace("2026-11-29", "2026-11-29T10:00:00"),
            "not a plain date",
        ),
        (ok.replace("2026-11-29", "\"soon\""), "x.toml"),
        (ok.replace("reason =", "why ="), "x.toml"),
        (ok.replace("expires = 2026-11-29\n", ""), "x.toml"),
        (
            ok.replace("synth-llama/*", "synth-[llama"),
            "not a valid glob",
        ),
    ] {
        let e = ExpectedFailures::parse(&bad, "x.toml", TODAY).unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains(says), "{bad}\n→ {e}");
    }
}

#[test]
fn long_lines_are_wrapped_and_summary_lines_cut() {
    let words: Vec<String> = (0..200).map(|i| format!("w{i}")).collect();
    let long = format!("FAIL a/b/c: {}", words.join(" "));
    assert!(long.len() > 700);
    let w = wrap_line(&long, 80);
    let lines: Vec<&str> = w.lines().collect();
    assert!(lines.len() > 8, "{w}");
    assert!(lines.iter().all(|l| l.chars().count() <= 80), "{w}");
    assert!(lines[1..].iter().all(|l| l.starts_with("    ")), "{w}");
    // nothing is lost
    assert_eq!(
        w.split_whitespace().collect::<Vec<_>>(),
        long.split_whitespace().collect::<Vec<_>>()
    );
    let c = cut(&long, 50);
    assert_eq!(c.chars().count(), 50);
    assert!(c.ends_with('…'));
    assert_eq!(cut("short", 50), "short");
}

#[test]
fn summary_folds_runs_of_one_model_with_one_reason() {
    let c = |id: &str, m: &str, why: &str| (id.to_string(), m.to_string(), why.to_string());
    let lines = folded_lines(
        "FAIL",
        [
            c("a/p1/ggml", "a", "engine_error — refused"),
            c("a/p2/ggml", "a", "engine_error — refused"),
            c("a/p3/ggml", "a", "engine_error — refused"),
            c("a/p4/ggml", "a", "top1_agreement = 0.5 (threshold 1)"),
            c("b/p1/ggml", "b", "engine_error — refused"),
        ]
        .into_iter(),
    );
    assert_eq!(
        lines,
        [
            "  FAIL a (3 cells): engine_error — refused",
            "  FAIL a/p4/ggml: top1_agreement = 0.5 (threshold 1)",
            "  FAIL b/p1/ggml: engine_error — refused",
        ]
    );
}
