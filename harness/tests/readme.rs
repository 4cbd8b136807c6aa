//! README.md stays true to the engine's registries (issue 41):
//!
//! - the intro's `Architectures:` sentence (before "## Two commands": "Architectures: decoders `llama`, …;
//!   encoder `bert`.") lists, as backticked names, exactly the architectures the engine loads —
//!   `lockstep_engine::models::ARCHITECTURES`, `ENCODER_ARCHITECTURES` and `SPEECH_ARCHITECTURES`;
//! - the "**Seeded models**" parenthesis under "## Models" (`synth-llama`, …, `synth-bert`) names exactly one
//!   `synth-<arch>` per architecture of `lockstep_engine::synth::SYNTH_ARCHS`.
//!
//! Both compare sets (order and line wrapping are free); a failure names what is missing from the README,
//! what is extra in it and what it lists twice.

use std::collections::BTreeSet;
use std::path::Path;

use lockstep_engine::models::{ARCHITECTURES, ENCODER_ARCHITECTURES, SPEECH_ARCHITECTURES};
use lockstep_engine::synth::SYNTH_ARCHS;

/// The checkout's README.md.
fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text of `text` from its only occurrence of `start` up to the first `end` after it.
fn span<'a>(text: &'a str, start: &str, end: char, what: &str) -> &'a str {
    let found: Vec<usize> = text.match_indices(start).map(|(i, _)| i).collect();
    assert_eq!(
        found.len(),
        1,
        "README.md: expected exactly one {start:?} ({what}), found {}",
        found.len()
    );
    let rest = &text[found[0] + start.len()..];
    let stop = rest
        .find(end)
        .unwrap_or_else(|| panic!("README.md: {start:?} ({what}) has no closing {end:?}"));
    &rest[..stop]
}

/// The backticked names in `text`, in order.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The names of the intro's `Architectures:` sentence (the README's text before its first `## ` section).
fn readme_architectures(text: &str) -> Vec<&str> {
    let intro = text.split("\n## ").next().unwrap_or_default();
    backticked(span(
        intro,
        "Architectures:",
        '.',
        "the intro's list of architectures",
    ))
}

/// The `<arch>` of each `synth-<arch>` in the "**Seeded models** (…)" parenthesis.
fn readme_seeded_archs(text: &str) -> Vec<&str> {
    let list = span(
        text,
        "**Seeded models** (",
        ')',
        "the list of seeded models",
    );
    backticked(list)
        .into_iter()
        .filter_map(|name| name.strip_prefix("synth-"))
        .collect()
}

/// Every architecture the engine loads: decoders, encoders, then encoder–decoders (Whisper).
fn engine_architectures() -> Vec<&'static str> {
    ARCHITECTURES
        .iter()
        .map(|(n, _)| *n)
        .chain(ENCODER_ARCHITECTURES.iter().map(|(n, _)| *n))
        .chain(SPEECH_ARCHITECTURES.iter().map(|(n, _)| *n))
        .collect()
}

/// `None` when `readme` and `engine` are the same set and `readme` names nothing twice; else the message
/// naming what the README lacks, what it has beyond `engine` and what it repeats.
fn mismatch(what: &str, readme: &[&str], engine: &[&str]) -> Option<String> {
    let r: BTreeSet<&str> = readme.iter().copied().collect();
    let e: BTreeSet<&str> = engine.iter().copied().collect();
    let missing: Vec<&str> = e.difference(&r).copied().collect();
    let extra: Vec<&str> = r.difference(&e).copied().collect();
    let twice: BTreeSet<&str> = readme
        .iter()
        .copied()
        .filter(|n| readme.iter().filter(|m| *m == n).count() > 1)
        .collect();
    (!missing.is_empty() || !extra.is_empty() || !twice.is_empty()).then(|| {
        format!(
            "README.md's {what} is out of date: missing from the README {missing:?}, extra in the README \
             {extra:?}, listed twice {twice:?} (the engine: {engine:?})"
        )
    })
}

#[test]
fn the_readme_intro_lists_every_architecture_the_engine_loads() {
    let text = readme();
    let what = "`Architectures:` sentence (the intro)";
    if let Some(m) = mismatch(what, &readme_architectures(&text), &engine_architectures()) {
        panic!("{m}");
    }
}

#[test]
fn the_readme_seeded_models_are_one_per_synth_arch() {
    let text = readme();
    let what = "**Seeded models** list (## Models), as synth-<arch>";
    if let Some(m) = mismatch(what, &readme_seeded_archs(&text), SYNTH_ARCHS) {
        panic!("{m}");
    }
}

/// The checks can fail, and say why: a list with the engine's first name dropped and a name the engine does
/// not have added is reported with both names, and a name listed twice as such.
#[test]
fn a_stale_list_is_reported_with_the_missing_and_the_extra_names() {
    let engine = engine_architectures();
    for engine_list in [engine.as_slice(), SYNTH_ARCHS] {
        let mut stale = engine_list[1..].to_vec();
        stale.push("mistral");
        let m = mismatch("list", &stale, engine_list).expect("a stale list is a mismatch");
        let expected = format!(
            "missing from the README [{:?}], extra in the README [\"mistral\"], listed twice {{}}",
            engine_list[0]
        );
        assert!(m.contains(&expected), "{m}\nlacks: {expected}");
        stale.push("mistral");
        let m = mismatch("list", &stale, engine_list).expect("a repeated name is a mismatch");
        assert!(m.contains("listed twice {\"mistral\"}"), "{m}");
    }
}
