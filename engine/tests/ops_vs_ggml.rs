//! The non-matmul ops of ggml mode against the real ggml CPU backend, bit for bit.
//!
//! Fixtures: `tests/fixtures/ops/`, written by `oracles/fixtures/make_ops_fixtures.py`, which calls this
//! machine's libggml-cpu (llama-cpp-python 0.3.36, AVX-512 build) through ctypes on realistic activations (the
//! `prose` golden's stages, jittered in the low bits) and on edge rows; `manifest.tsv` lists the cases and
//! `index.json` records provenance. Every comparison here is exact (f32 bits), except where a case documents
//! llama.cpp's own batch dependence (the KQV accumulation order of a prompt batch vs a decode step).

use std::path::{Path, PathBuf};

use lockstep_engine::kv_cache::KvCache;
use lockstep_engine::ops::{self, ggml_cpu, KqvOrder};
use lockstep_engine::{GgmlTarget, Numerics, NumericsMode, Simd};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ops")
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

fn f64s(name: &str) -> Vec<f64> {
    bytes(name)
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn i32s(name: &str) -> Vec<i32> {
    bytes(name)
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The manifest lines of one kind, split into fields (the kind dropped).
fn cases(kind: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir().join("manifest.tsv")).expect("manifest.tsv");
    let out: Vec<Vec<String>> = text
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect::<Vec<_>>())
        .filter(|f| f[0] == kind)
        .map(|f| f[1..].to_vec())
        .collect();
    assert!(!out.is_empty(), "no {kind} case in the manifest");
    out
}

fn num<T: std::str::FromStr>(s: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse().unwrap_or_else(|e| panic!("{s:?}: {e:?}"))
}

fn list(s: &str) -> Vec<usize> {
    s.split(',').map(num).collect()
}

/// Panics with the first element whose bits differ.
#[track_caller]
fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        let n = got
            .iter()
            .zip(want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        panic!(
            "{what}: {n} of {} values differ; first at {i}: {:e} vs ggml {:e}",
            got.len(),
            got[i],
            want[i]
        );
    }
}

#[test]
fn vec_dot_f32_every_leftover_shape() {
    for c in cases("vec_dot") {
        let (name, ns) = (&c[0], list(&c[2]));
        let (x, y, want) = (
            f32s(&format!("{name}.x.f32.bin")),
            f32s(&format!("{name}.y.f32.bin")),
            f32s(&format!("{name}.out.f32.bin")),
        );
        assert_eq!(ns.len(), want.len());
        for (&n, &w) in ns.iter().zip(&want) {
            let got = ggml_cpu::vec_dot_f32(GgmlTarget::Avx512, &x[..n], &y[..n]);
            assert_eq!(
                got.to_bits(),
                w.to_bits(),
                "ggml_vec_dot_f32 n={n}: {got:e} vs {w:e}"
            );
        }
    }
}

#[test]
fn swiglu_matches_ggml_vec_swiglu_f32_and_the_glu_op() {
    for c in cases("swiglu_vec") {
        let (name, rows, width) = (&c[0], num::<usize>(&c[1]), num::<usize>(&c[2]));
        let up = f32s(&format!("{name}.up.f32.bin"));
        let mut x = f32s(&format!("{name}.gate.f32.bin"));
        assert_eq!(x.len(), rows * width);
        for (r, u) in x.chunks_exact_mut(width).zip(up.chunks_exact(width)) {
            ggml_cpu::swiglu_row(GgmlTarget::Avx512, r, u);
        }
        assert_bits(name, &x, &f32s(&format!("{name}.out.f32.bin")));
    }
    for c in cases("swiglu") {
        let (name, width, input) = (&c[0], num::<usize>(&c[2]), &c[3]);
        let up = f32s(&format!("{input}.up.f32.bin"));
        for simd in Simd::ALL.into_iter().filter(|s| s.available()) {
            let mut x = f32s(&format!("{input}.gate.f32.bin"));
            ops::swiglu(
                &mut x,
                &up,
                width,
                Numerics::ggml(GgmlTarget::Avx512).with_simd(simd),
            );
            assert_bits(
                &format!("{name} simd {simd}"),
                &x,
                &f32s(&format!("{name}.out.f32.bin")),
            );
        }
    }
}

#[test]
fn softmax_matches_ggml_vec_soft_max_f32_and_soft_max_ext() {
    for c in cases("softmax_vec") {
        let (name, rows, width, input) = (&c[0], num::<usize>(&c[1]), num::<usize>(&c[2]), &c[3]);
        let x = f32s(&format!("{input}.x.f32.bin"));
        let stride = x.len() / rows;
        let (want, want_sum) = (
            f32s(&format!("{name}.out.f32.bin")),
            f64s(&format!("{name}.sum.f64.bin")),
        );
        for r in 0..rows {
            let mut row = x[r * stride..r * stride + width].to_vec();
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let sum = ggml_cpu::vec_soft_max_f32(GgmlTarget::Avx512, &mut row, max);
            assert_eq!(
                sum.to_bits(),
                want_sum[r].to_bits(),
                "{name} row {r}: sum {sum:e} vs {:e}",
                want_sum[r]
            );
            assert_bits(
                &format!("{name} row {r}"),
                &row,
                &want[r * width..(r + 1) * width],
            );
        }
    }
    for c in cases("softmax") {
        let (name, rows, width) = (&c[0], num::<usize>(&c[1]), num::<usize>(&c[2]));
        let (scale, period, input) = (num::<f32>(&c[3]), num::<usize>(&c[4]), &c[5]);
        let x = f32s(&format!("{input}.x.f32.bin"));
        let want = f32s(&format!("{name}.out.f32.bin"));
        for r in 0..rows {
            let mut row = x[r * width..(r + 1) * width].to_vec();
            let mask: Vec<f32> = (0..width)
                .map(|j| {
                    if j <= r % period {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            ggml_cpu::soft_max_row(GgmlTarget::Avx512, &mut row, Some(&mask), scale);
            assert_bits(
                &format!("{name} row {r}"),
                &row,
                &want[r * width..(r + 1) * width],
            );
            // the attention path masks by filling −∞ instead of adding a mask: the same bits
            let mut row2 = x[r * width..(r + 1) * width].to_vec();
            row2[r % period + 1..].fill(f32::NEG_INFINITY);
            ggml_cpu::soft_max_row(GgmlTarget::Avx512, &mut row2, None, scale);
            assert_bits(
                &format!("{name} row {r} (−∞ fill)"),
                &row2,
                &want[r * width..(r + 1) * width],
            );
        }
    }
}

#[test]
fn rope_matches_ggml_rope_ext_normal() {
    for c in cases("rope") {
        let (name, rows, n_head, hd) = (
            &c[0],
            num::<usize>(&c[1]),
            num::<usize>(&c[2]),
            num::<usize>(&c[3]),
        );
        let base = num::<f32>(&c[4]);
        let mut x = f32s(&format!("{name}.x.f32.bin"));
        let pos = i32s(&format!("{name}.pos.i32.bin"));
        let width = n_head * hd;
        let mut cache = vec![0f32; hd];
        for (r, row) in x.chunks_exact_mut(width).enumerate() {
            ops::rope_cache(pos[r] as usize, base, hd, &mut cache);
            ops::rope_norm(row, hd, hd, &cache, NumericsMode::Ggml);
        }
        assert_eq!(x.len(), rows * width);
        assert_bits(name, &x, &f32s(&format!("{name}.out.f32.bin")));
    }
}

#[test]
fn rms_norm_matches_ggml_rms_norm_mul() {
    for c in cases("rms_norm") {
        let (name, eps) = (&c[0], num::<f32>(&c[3]));
        let mut x = f32s(&format!("{name}.x.f32.bin"));
        ops::rms_norm(&mut x, &f32s(&format!("{name}.w.f32.bin")), eps);
        assert_bits(name, &x, &f32s(&format!("{name}.out.f32.bin")));
    }
}

/// Run one attention case through [`ops::attention_ggml`] in `order` (or `ops::attention` in ggml mode when
/// `order` is `None`); returns `[rows, n_head·hd]`.
fn run_attention(c: &[String], order: Option<KqvOrder>, simd: Simd) -> Vec<f32> {
    let (kind, n_head, n_kv, hd) = (
        &c[1],
        num::<usize>(&c[2]),
        num::<usize>(&c[3]),
        num::<usize>(&c[4]),
    );
    let (positions, input) = (list(&c[5]), &c[6]);
    let (q, k, v) = (
        f32s(&format!("{input}.q.f32.bin")),
        f32s(&format!("{input}.k.f32.bin")),
        f32s(&format!("{input}.v.f32.bin")),
    );
    let (qw, kvw) = (n_head * hd, n_kv * hd);
    let n_pos = k.len() / kvw;
    let mut cache = KvCache::new(1, n_kv, hd, n_pos);
    let mut out = vec![0f32; positions.len() * qw];
    let mut scores = vec![0f32; ops::attention_scratch_len(n_pos)];
    let shape = ops::AttnShape::causal(n_head, n_kv, hd);
    let mut written = 0;
    for (t, &p) in positions.iter().enumerate() {
        // batch: the whole batch is in the cache before attention; single: up to this token
        let upto = if kind == "batch" {
            *positions.iter().max().unwrap()
        } else {
            p
        };
        while written <= upto {
            cache
                .write(
                    0,
                    written,
                    &k[written * kvw..(written + 1) * kvw],
                    &v[written * kvw..(written + 1) * kvw],
                )
                .unwrap();
            written += 1;
        }
        let (qt, ot) = (&q[p * qw..(p + 1) * qw], &mut out[t * qw..(t + 1) * qw]);
        match order {
            Some(o) => ops::attention_ggml(
                qt,
                &cache,
                0,
                p,
                &shape,
                &mut scores,
                ot,
                Numerics::ggml(GgmlTarget::Avx512).with_simd(simd),
                o,
            ),
            None => ops::attention(
                qt,
                &cache,
                0,
                p,
                &shape,
                &mut scores,
                ot,
                Numerics::ggml(GgmlTarget::Avx512).with_simd(simd),
                // the batch kind of the case: a prompt batch or single-token steps
                ops::ggml_kqv_order(if kind == "batch" { positions.len() } else { 1 }),
            ),
        }
    }
    out
}

#[test]
fn attention_matches_llama_cpp_prefill_and_decode_graphs() {
    for c in cases("attention") {
        let name = &c[0];
        let want = f32s(&format!("{name}.out.f32.bin"));
        // llama.cpp: a batch of ≥ 2 tokens runs KQV through tinyBLAS, a single token through vec_dot
        let order = if c[1] == "batch" {
            KqvOrder::TinyBlas
        } else {
            KqvOrder::VecDot
        };
        // every SIMD setting this CPU runs gives llama.cpp's bits
        for simd in Simd::ALL.into_iter().filter(|s| s.available()) {
            assert_bits(
                &format!("{name} ({order:?}, simd {simd})"),
                &run_attention(&c, Some(order), simd),
                &want,
            );
            // ggml mode proper picks the order from the batch, as llama.cpp does
            let default = run_attention(&c, None, simd);
            assert_bits(&format!("{name} (ggml mode, simd {simd})"), &default, &want);
        }
    }
}

#[test]
fn llama_cpp_itself_is_batch_dependent_after_16_positions() {
    // llama.cpp's own prompt-pass and decode-step results for the same query and cache: equal while every
    // KQV lane holds one product (≤ 16 positions), different in the last bits afterwards. This is why ggml
    // mode picks the order per batch (ops::ggml_kqv_order).
    let all = cases("attention");
    let get = |n: &str| {
        all.iter()
            .find(|c| c[0] == n)
            .unwrap_or_else(|| panic!("no case {n}"))
    };
    let (pre, dec) = (get("attn_prefill"), get("attn_decode"));
    let qw = num::<usize>(&pre[2]) * num::<usize>(&pre[4]);
    let (pre_pos, dec_pos) = (list(&pre[5]), list(&dec[5]));
    let (a, b) = (
        f32s("attn_prefill.out.f32.bin"),
        f32s("attn_decode.out.f32.bin"),
    );
    let mut differ = 0;
    for (t, &p) in dec_pos.iter().enumerate() {
        let r = pre_pos.iter().position(|&x| x == p).unwrap();
        let (x, y) = (&a[r * qw..(r + 1) * qw], &b[t * qw..(t + 1) * qw]);
        if p < 16 {
            assert_bits(&format!("position {p}"), x, y);
        } else if x.iter().zip(y).any(|(u, v)| u.to_bits() != v.to_bits()) {
            differ += 1;
        }
    }
    assert!(differ > 0);
}
