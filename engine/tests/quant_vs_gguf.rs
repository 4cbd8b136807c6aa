//! The quant kernels against the two oracles, on real blocks of SmolLM2-135M-Instruct Q4_1 and of its
//! variants made by llama-quantize (Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS `blk.0.ffn_down` rows), and on
//! real F32 values quantized by the oracles (fixtures made by `oracles/fixtures/make_quant_fixtures.py`, described
//! in `tests/fixtures/quant/index.json`, listed in `manifest.tsv`):
//!
//! - `gguf` (the Python package, 0.17.1): [`dequantize_row`] equals its dequantization bit for bit, and
//!   [`quantize_row`] on the quantizer's input reproduces its bytes. No tolerance anywhere. (gguf's Q4_0 and
//!   Q5_0 quantizers emulate an fma-contracted `x*id + 8.5`, libggml-base's `_ref` does not contract; the
//!   two can differ on an exact rounding tie, which none of these inputs hits — the generator checks that
//!   gguf's bytes equal ggml's.)
//! - `ggml` (libggml-base / libggml-cpu from llama-cpp-python 0.3.36, this machine's build): the `_ref`
//!   quantizers' bytes, the activation conversion ggml-cpu's mul_mat applies (x86 `quantize_row_q8_0`,
//!   `quantize_row_q8_1`, `quantize_row_q8_K`, `ggml_cpu_fp32_to_fp16`, `ggml_cpu_fp32_to_bf16`), and the
//!   dispatched x86 `ggml_vec_dot_*` results: all reproduced bit for bit by ggml mode.

use std::path::{Path, PathBuf};

use lockstep_engine::quant::{
    dequantize_row, ggml_path, quantize_row, vec_dot, vec_dot_path, GgmlPath, GgmlType, PreparedRow,
};
use lockstep_engine::{GgmlTarget, NumericsMode};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

fn bytes(name: &str) -> Vec<u8> {
    let p = dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn f32s(name: &str) -> Vec<f32> {
    bytes(name)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn ty(name: &str) -> GgmlType {
    [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::IQ4_NL,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
        GgmlType::Q8_K,
    ]
    .into_iter()
    .find(|t| t.name() == name)
    .unwrap_or_else(|| panic!("unknown type {name}"))
}

fn manifest() -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir().join("manifest.tsv")).expect("manifest.tsv");
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

/// Index of the first differing f32 (by bits), if any.
fn first_diff(a: &[f32], b: &[f32]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
}

fn first_byte_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[test]
fn dequantize_matches_gguf_bit_for_bit_and_quantize_reproduces_its_bytes() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for row in manifest().iter().filter(|r| r[0] == "dequant") {
        let (name, t, n, has_src) = (
            &row[1],
            ty(&row[2]),
            row[3].parse::<usize>().unwrap(),
            row[4] == "1",
        );
        let blocks = bytes(&format!("{name}.blocks.bin"));
        let want = f32s(&format!("{name}.f32.bin"));
        assert_eq!(want.len(), n, "{name}");
        let mut got = vec![0f32; n];
        dequantize_row(t, &blocks, &mut got).unwrap();
        if let Some(i) = first_diff(&got, &want) {
            failures.push(format!(
                "{name} ({t}): dequantized element {i}: {} vs gguf {}",
                got[i], want[i]
            ));
        }
        if has_src {
            let src = f32s(&format!("{name}.src.f32.bin"));
            let q = quantize_row(t, &src).unwrap();
            if let Some(i) = first_byte_diff(&q, &blocks) {
                failures.push(format!(
                    "{name} ({t}): quantize_row byte {i} differs from gguf's"
                ));
            }
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} dequant fixtures");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn quantize_row_matches_ggml_ref_quantizers() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for row in manifest().iter().filter(|r| r[0] == "quant") {
        let (name, t) = (&row[1], ty(&row[2]));
        let src = f32s(&format!("{name}.src.f32.bin"));
        let want = bytes(&format!("{name}.blocks.bin"));
        let got = quantize_row(t, &src).unwrap();
        if let Some(i) = first_byte_diff(&got, &want) {
            failures.push(format!(
                "{name} ({t}): byte {i}: {:?} vs ggml {:?}",
                got.get(i),
                want.get(i)
            ));
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} quant fixtures");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A weight type whose `vec_dot_type` is `act`.
fn weight_for(act: GgmlType) -> GgmlType {
    match act {
        GgmlType::Q8_0 => GgmlType::Q8_0,
        GgmlType::Q8_1 => GgmlType::Q4_1,
        GgmlType::Q8_K => GgmlType::Q6_K,
        other => other,
    }
}

#[test]
fn activation_conversion_matches_ggml_cpu_from_float() {
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut p = PreparedRow::new();
    for row in manifest().iter().filter(|r| r[0] == "act") {
        let name = &row[1];
        let x = f32s(&format!("{name}.f32.bin"));
        for act in [
            GgmlType::Q8_0,
            GgmlType::Q8_1,
            GgmlType::Q8_K,
            GgmlType::F16,
            GgmlType::BF16,
        ] {
            let want = bytes(&format!("{name}.{}.bin", act.name().to_lowercase()));
            p.prepare(weight_for(act), NumericsMode::Ggml, &x).unwrap();
            let (t, got) = p.ggml_blocks().unwrap();
            assert_eq!(t, act);
            if let Some(i) = first_byte_diff(got, &want) {
                let bs = act.type_size();
                failures.push(format!(
                    "{name} as {act}: byte {i} (block {}) differs from ggml",
                    i / bs
                ));
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} activation fixtures");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn ggml_mode_vec_dot_matches_ggml_cpu_bit_for_bit() {
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut p = PreparedRow::new();
    let mut r = PreparedRow::new();
    for row in manifest().iter().filter(|r| r[0] == "dot") {
        let (name, t) = (&row[1], ty(&row[2]));
        let (rows, n) = (
            row[3].parse::<usize>().unwrap(),
            row[4].parse::<usize>().unwrap(),
        );
        let (act, weight) = (&row[5], &row[6]);
        let w = bytes(&format!("{weight}.blocks.bin"));
        let x = f32s(&format!("{act}.f32.bin"));
        let want = f32s(&format!("{name}.result.f32.bin"));
        let rb = t.bytes_for(n as u64).unwrap();
        assert_eq!(w.len(), rows * rb, "{weight}");
        p.prepare(t, NumericsMode::Ggml, &x).unwrap();
        r.prepare(t, NumericsMode::Reference, &x).unwrap();
        let mut wf = vec![0f32; n];
        for (i, want) in want.iter().enumerate() {
            let row_bytes = &w[i * rb..(i + 1) * rb];
            let got = vec_dot(t, row_bytes, &p);
            if got.to_bits() != want.to_bits() {
                failures.push(format!(
                    "{name} row {i}: ggml mode {got:e} vs ggml-cpu {want:e} (diff {:e})",
                    got - want
                ));
            }
            // reference mode: close to the exact dot product of the dequantized weights with x
            dequantize_row(t, row_bytes, &mut wf).unwrap();
            let exact: f64 = wf
                .iter()
                .zip(&x)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let mag: f64 = wf
                .iter()
                .zip(&x)
                .map(|(a, b)| f64::from((a * b).abs()))
                .sum();
            let got_ref = f64::from(vec_dot(t, row_bytes, &r));
            if (got_ref - exact).abs() > mag * 1e-5 {
                failures.push(format!(
                    "{name} row {i}: reference mode {got_ref:e} vs exact {exact:e}"
                ));
            }
            checked += 1;
        }
    }
    assert!(checked >= 250, "only {checked} dot fixtures");
    assert!(
        failures.is_empty(),
        "{} of {checked} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The kernel a plain ggml context runs for output column `t` of a `batch`-column matmul: [`ggml_path`]
/// without repacking (a ggml context has no `CPU_REPACK` buffer): a would-be repacked Q4_K (or Q2_K, on
/// the AVX-512 host of the fixtures) takes the tiled path at batch >= 8, IQ4_NL tinyBLAS_Q0 at
/// batch >= 2, and the rest vec_dot (Q4_0's tinyBLAS_Q0 computes the same).
fn plain_context_path(t: GgmlType, rows: usize, cols: usize, batch: usize, j: usize) -> GgmlPath {
    match ggml_path(t, rows, cols, batch, j, GgmlTarget::Avx512) {
        GgmlPath::RepackGemv | GgmlPath::RepackGemm => match t {
            GgmlType::Q4_K | GgmlType::Q2_K if batch >= 8 => GgmlPath::Tiled,
            GgmlType::IQ4_NL if batch >= 2 => GgmlPath::TinyBlasQ0,
            _ => GgmlPath::VecDot,
        },
        p => p,
    }
}

/// Whole `ggml_mul_mat` ops from ggml's CPU backend at batch 1, 4 and 9, which route through vec_dot,
/// llamafile's tinyBLAS (batch >= 2) and the tiled K-quant kernels (batch >= 8), each output computed by
/// ggml mode through the path [`ggml_path`] names for it. Every quantized weight type must match every
/// output bit for bit (vec_dot, `tinyBLAS_Q0_AVX` for Q4_0/Q5_0/Q8_0/IQ4_NL, tiled for the K-quants and
/// IQ4_XS); tinyBLAS for float weights only closely — the documented gap.
#[test]
fn ggml_mode_matches_whole_ggml_mul_mat_where_the_kernels_agree() {
    let mut exact_checked = 0;
    let mut failures = Vec::new();
    let mut report = Vec::new();
    let mut p = PreparedRow::new();
    for row in manifest().iter().filter(|r| r[0] == "matmul") {
        let (name, t) = (&row[1], ty(&row[2]));
        let [rows, n, batch] = [3, 4, 5].map(|i| row[i].parse::<usize>().unwrap());
        let (weight, expect) = (&row[6], row[7].as_str());
        let w = bytes(&format!("{weight}.blocks.bin"));
        let acts = f32s(&format!("mm_act_b{batch}.f32.bin"));
        let want = f32s(&format!("{name}.result.f32.bin"));
        assert_eq!(
            (acts.len(), want.len()),
            (batch * n, batch * rows),
            "{name}"
        );
        let rb = t.bytes_for(n as u64).unwrap();
        let (mut same, mut worst) = (0, 0f64);
        for j in 0..batch {
            p.prepare(t, NumericsMode::Ggml, &acts[j * n..(j + 1) * n])
                .unwrap();
            for r in 0..rows {
                let path = plain_context_path(t, rows, n, batch, j);
                let got = vec_dot_path(t, &w[r * rb..(r + 1) * rb], &p, path);
                let want = want[j * rows + r];
                if got.to_bits() == want.to_bits() {
                    same += 1;
                    continue;
                }
                let rel = f64::from((got - want).abs()) / f64::from(want.abs()).max(1e-30);
                worst = worst.max(rel);
                if expect == "exact" {
                    failures.push(format!(
                        "{name} column {j} row {r}: {got:e} vs ggml {want:e}"
                    ));
                } else if rel > 1e-4 {
                    failures.push(format!(
                        "{name} column {j} row {r}: {got:e} vs ggml {want:e} (rel {rel:e})"
                    ));
                }
            }
        }
        if expect == "exact" {
            exact_checked += batch * rows;
        }
        report.push(format!(
            "{name}: {same}/{} bit-identical, worst rel diff {worst:.1e} ({expect})",
            batch * rows
        ));
    }
    eprintln!("{}", report.join("\n"));
    assert!(
        exact_checked >= 600,
        "only {exact_checked} exact matmul outputs"
    );
    assert!(
        failures.is_empty(),
        "{} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
