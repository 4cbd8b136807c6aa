//! Issue 42: `--simd off` runs the portable code in every mode. `quant::dequantize_row` used to take the
//! AVX2 dequantizers wherever the CPU had AVX2, whatever `--simd` said, so a bug in the portable Q4_0 …
//! Q6_K dequantization was invisible to reference mode on any AVX2 CPU. Here a bug is planted in the
//! portable Q4_0 dequantizer only ([`Fault::PortableDequantHalvesSwapped`]) and the seeded Q4_0 model
//! (`synth-llama-q4_0`, made in the cache on first use, no download) is gated against its committed
//! golden: with SIMD off the gate must fail in reference mode (its matmuls' weight rows) and in ggml mode
//! (the embedding lookup, the one place ggml mode dequantizes a Q4_0 weight to f32); with a SIMD setting,
//! which runs the AVX2 dequantizer, reference mode must still pass — and the unbroken engine passes with
//! SIMD off. Nothing depends on which x86 features this host has: the SIMD checks run where
//! [`Simd::Avx2`] is available (under `LOCKSTEP_CPU=avx2` as on an AVX-512 host; skipped, said, under
//! `LOCKSTEP_CPU=scalar`), and `avx2` is the setting they use on every host.
//!
//! The fault switch is process-wide: nextest runs each test in a process of its own, and under
//! `cargo test` the tests of this file take turns ([`SWITCH`]).

mod common;

use common::root;
use lockstep::bisect::{bisect_with, render, BisectOptions, BisectReport};
use lockstep::engine::LockstepEngine;
use lockstep::judge::Finding;
use lockstep_engine::faults::{self, Fault};
use lockstep_engine::quant::{dequantize_row_with, quantize_row, GgmlType};
use lockstep_engine::{NumericsMode, Simd, Stage, StageKind};

/// A seeded model whose every matrix (the tied embedding included) is Q4_0: the type the fault hits.
const MODEL: &str = "synth-llama-q4_0";
const PROMPT: &str = "synth";
const ORACLE: &str = "llama.cpp-f32kv";
const FAULT: Fault = Fault::PortableDequantHalvesSwapped;

static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `lockstep bisect`'s run of the cell (`mode`, `simd`) of [`MODEL`] against the committed golden, with
/// `fault` on for the run only; its `gate` is what `lockstep run` decides for the cell.
fn gate(mode: NumericsMode, simd: Simd, fault: Option<Fault>) -> BisectReport {
    // made (and checked against its registered sha256) before any fault is on
    let path = lockstep::fetch::resolve_model(MODEL).unwrap();
    let opts = BisectOptions {
        golden_dir: root().join("golden"),
        thresholds: root().join("ci/thresholds.toml"),
        model: MODEL.into(),
        prompt: PROMPT.into(),
        mode,
        oracle: ORACLE.into(),
        ggml_target: None,
        floors: root().join("ci/floors.json"),
        simd,
    };
    let mut engine = LockstepEngine::load(&path).unwrap().with_simd(simd);
    faults::set(fault);
    let r = bisect_with(&opts, &path, &mut engine);
    faults::set(None);
    r.unwrap_or_else(|e| panic!("{MODEL} {mode} {simd} {fault:?}: {e:#}"))
}

/// True when bisect's verdict is structural where the bug enters: the embedding lookup (the Q4_0
/// `token_embd`, the first stage that reads a dequantized Q4_0 row), or layer 0 — a golden without an
/// `embed` array lets bisect name no earlier stage than the first layer's.
fn named_at_the_entry(r: &BisectReport) -> bool {
    let Finding::Structural { at, .. } = &r.finding else {
        return false;
    };
    Stage::parse(&at.stage).is_some_and(|s| s.kind == StageKind::Embed || s.layer == Some(0))
}

#[test]
fn a_bug_in_the_portable_dequantizer_fails_the_simd_off_gate() {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let clean = gate(NumericsMode::Reference, Simd::Off, None);
    assert!(
        clean.gate.pass && clean.is_clean(),
        "the unbroken engine, reference/off:\n{}",
        render(&clean)
    );

    // reference mode, SIMD off: every matmul's weight rows go through the portable dequantizer
    let r = gate(NumericsMode::Reference, Simd::Off, Some(FAULT));
    assert!(
        !r.gate.pass,
        "reference/off passed with the portable Q4_0 dequantizer broken: it did not run\n{}",
        render(&r)
    );
    assert!(named_at_the_entry(&r), "{}", render(&r));

    // ggml mode, SIMD off: its integer dot kernels never dequantize, but the embedding lookup does
    let g = gate(NumericsMode::Ggml, Simd::Off, Some(FAULT));
    assert!(!g.gate.pass, "ggml/off passed:\n{}", render(&g));
    assert!(named_at_the_entry(&g), "{}", render(&g));

    // a SIMD setting runs the AVX2 dequantizer, which the fault is not in
    if Simd::Avx2.available() {
        let s = gate(NumericsMode::Reference, Simd::Avx2, Some(FAULT));
        assert!(
            s.gate.pass && s.is_clean(),
            "reference/avx2 ran the portable dequantizer:\n{}",
            render(&s)
        );
    } else {
        eprintln!("no AVX2 on this CPU (or LOCKSTEP_CPU=scalar): the SIMD half skipped");
    }
}

/// The fault changes what `dequantize_row_with` gives under [`Simd::Off`] — each block's two halves
/// swapped, nothing else — and not what it gives under a SIMD setting on a CPU with AVX2 (the AVX2
/// dequantizer), which still has the unbroken bits. So `off` is the portable code and the SIMD settings
/// are not.
#[test]
fn the_planted_bug_is_in_the_portable_q4_0_dequantizer_only() {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let n = 256;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let q = quantize_row(GgmlType::Q4_0, &x).unwrap();
    let deq = |simd: Simd| {
        let mut y = vec![f32::NAN; n];
        dequantize_row_with(GgmlType::Q4_0, &q, &mut y, simd).unwrap();
        y.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
    };
    let off = deq(Simd::Off);
    faults::set(Some(FAULT));
    let broken = deq(Simd::Off);
    let simd = Simd::Avx2
        .available()
        .then(|| (deq(Simd::Avx2), deq(Simd::Avx512)));
    faults::set(None);
    assert_ne!(
        broken, off,
        "the fault did not reach the portable dequantizer"
    );
    let swapped: Vec<u32> = off
        .chunks_exact(32)
        .flat_map(|b| b[16..].iter().chain(&b[..16]).copied())
        .collect();
    assert_eq!(broken, swapped, "the fault is more than the halves swapped");
    match simd {
        Some((avx2, avx512)) => {
            assert_eq!(avx2, off, "the fault reached avx2's dequantizer");
            assert_eq!(avx512, off, "the fault reached avx512's dequantizer");
        }
        None => eprintln!("no AVX2 on this CPU (or LOCKSTEP_CPU=scalar): the SIMD half skipped"),
    }
}
