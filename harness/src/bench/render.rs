//! `bench.md` and `bench.csv`: the tables of a bench report, every outside string escaped.

use super::{BenchReport, Test};

/// `bench.md`: the settings, one table of every result in llama-bench's columns, the ratios with their
/// intervals, and decode's bandwidth use. Every value taken from the report is escaped by [`crate::format::md_text`].
pub fn render_bench_markdown(r: &BenchReport) -> String {
    use std::fmt::Write as _;
    let mut md = String::new();
    let e = &r.environment;
    let _ = writeln!(
        md,
        "# lockstep bench {}\n",
        crate::format::md_text(&r.run_id)
    );
    let _ = writeln!(
        md,
        "CPU {} ({}) · host SIMD kind {} · {} threads · lockstep {} at {} · {} repetitions per engine and test, \
         engines interleaved · read bandwidth {:.1} GB/s (median of {}){}\n",
        crate::format::md_text(&e.cpu_model),
        crate::format::md_text(&e.cpu_flags.join(" ")),
        if r.host_simd.is_empty() {
            "not recorded".to_string()
        } else {
            crate::format::md_text(&r.host_simd)
        },
        e.threads,
        crate::format::md_text(&e.lockstep_version),
        crate::format::md_text(&e.git_commit.chars().take(12).collect::<String>()),
        r.repetitions,
        r.read_bandwidth / 1e9,
        r.read_bandwidth_samples.len(),
        if r.fma_peak > 0.0 {
            format!(
                " · f32 FMA peak {:.1} GFLOP/s (fastest of {})",
                r.fma_peak / 1e9,
                r.fma_peak_samples.len()
            )
        } else {
            String::new()
        }
    );
    for s in &r.engines {
        let _ = writeln!(
            md,
            "- **{}**: {}{}",
            crate::format::md_text(&s.engine),
            crate::format::md_text(&s.binary),
            match (&s.mode, &s.simd) {
                (Some(m), Some(x)) => format!(
                    ", mode {}, simd {}",
                    crate::format::md_text(m),
                    crate::format::md_text(x)
                ),
                _ => String::new(),
            }
        );
    }
    if let Some(b) = &r.llama_cpp_build {
        let _ = writeln!(
            md,
            "- llama.cpp build: llama-cpp-python {} (vendored llama.cpp {}), {}, {}",
            crate::format::md_text(b["llama_cpp_python"].as_str().unwrap_or("?")),
            crate::format::md_text(b["vendored_llama_cpp_commit"].as_str().unwrap_or("?")),
            crate::format::md_text(b["compiler"].as_str().unwrap_or("?")),
            crate::format::md_text(
                &b["cmake_flags"]
                    .as_array()
                    .map(|a| a
                        .iter()
                        .filter_map(|v| v.as_str())
                        .collect::<Vec<_>>()
                        .join(" "))
                    .unwrap_or_default()
            )
        );
    }
    let _ = writeln!(md, "\n## Results\n");
    let _ = writeln!(
        md,
        "| engine | model_type | model | test | n_threads | type_k | flash_attn | median t/s | avg_ts ± stddev_ts | peak RSS MiB |"
    );
    let _ = writeln!(md, "|---|---|---|---|--:|---|---|--:|--:|--:|");
    for x in &r.results {
        let test = Test {
            n_prompt: x.n_prompt,
            n_gen: x.n_gen,
            n_depth: x.n_depth,
        };
        let engine = if x.mode.is_empty() {
            crate::format::md_text(&x.engine)
        } else {
            format!(
                "{} ({}, simd {})",
                crate::format::md_text(&x.engine),
                crate::format::md_text(&x.mode),
                crate::format::md_text(&x.simd)
            )
        };
        let _ = writeln!(
            md,
            "| {engine} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} ± {:.2} | {} |",
            crate::format::md_text(&x.model_type),
            crate::format::md_text(&x.model),
            test.name(),
            x.n_threads,
            crate::format::md_text(&x.type_k),
            crate::format::md_text(&x.flash_attn),
            x.median_ts,
            x.avg_ts,
            x.stddev_ts,
            mib(x.peak_rss_bytes)
        );
    }
    render_peak_rss(&mut md, r);
    let _ = writeln!(md, "\n## Ratios (median t/s, 95% bootstrap interval)\n");
    let _ = writeln!(md, "| model | test | ratio | 95% interval |");
    let _ = writeln!(md, "|---|---|--:|---|");
    for c in &r.comparisons {
        let _ = writeln!(
            md,
            "| {} | {} | {} / {} = {:.3} | [{:.3}, {:.3}] |",
            crate::format::md_text(&c.model),
            crate::format::md_text(&c.test),
            crate::format::md_text(&c.numerator),
            crate::format::md_text(&c.denominator),
            c.ratio,
            c.ci_low,
            c.ci_high
        );
    }
    if !r.bandwidth.is_empty() {
        let _ = writeln!(md, "\n## Decode and the read bandwidth\n");
        let _ = writeln!(
            md,
            "Bytes per token: the weights one decode step reads (the tied or separate output matrix in full, one \
             embedding row not counted; KV cache not counted). Bound = bandwidth ÷ bytes per token.\n"
        );
        let _ = writeln!(
            md,
            "| engine | model | test | MB per token | bound t/s | fraction of bandwidth |"
        );
        let _ = writeln!(md, "|---|---|---|--:|--:|--:|");
        for b in &r.bandwidth {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} | {:.0} | {:.1}% |",
                crate::format::md_text(&b.engine),
                crate::format::md_text(&b.model),
                crate::format::md_text(&b.test),
                b.bytes_per_token as f64 / 1e6,
                r.read_bandwidth / b.bytes_per_token as f64,
                100.0 * b.fraction
            );
        }
    }
    if !r.compute.is_empty() {
        let _ = writeln!(md, "\n## Prefill and the FMA peak\n");
        let _ = writeln!(
            md,
            "FLOPs: the weight matrices of the blocks per token, the output matrix once (last position's \
             logits), attention's KQ and KQV over the causal pairs — the work of a dense implementation. \
             Fraction = GFLOP/s ÷ the f32 FMA peak measured in this run.\n"
        );
        let _ = writeln!(
            md,
            "| engine | model | test | GFLOP per test | GFLOP/s | fraction of FMA peak |"
        );
        let _ = writeln!(md, "|---|---|---|--:|--:|--:|");
        for c in &r.compute {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.2} | {:.1} | {:.1}% |",
                crate::format::md_text(&c.engine),
                crate::format::md_text(&c.model),
                crate::format::md_text(&c.test),
                c.flops / 1e9,
                c.gflops,
                100.0 * c.fraction
            );
        }
    }
    md
}

/// Bytes as MiB with one decimal, `-` when not recorded.
fn mib(b: Option<u64>) -> String {
    b.map_or_else(
        || "-".to_string(),
        |b| format!("{:.1}", b as f64 / f64::from(1 << 20)),
    )
}

/// The "Peak RSS" section: per model and test, each engine's peak resident set (the largest over its
/// repetitions) side by side, and lockstep's over each other engine's. Nothing when no row has one.
fn render_peak_rss(md: &mut String, r: &BenchReport) {
    use std::fmt::Write as _;
    if r.results.iter().all(|x| x.peak_rss_bytes.is_none()) {
        return;
    }
    let mut engines: Vec<&str> = Vec::new();
    for x in &r.results {
        if !engines.contains(&x.engine.as_str()) {
            engines.push(&x.engine);
        }
    }
    let others: Vec<&str> = engines
        .iter()
        .copied()
        .filter(|e| *e != "lockstep")
        .collect();
    let _ = writeln!(
        md,
        "\n## Peak RSS\n\nThe largest resident set of a sample's process over the repetitions (`VmHWM` of the process while it ran, polled: the pages of the memory-mapped model it touched, its buffers, any derived copy of \
         weights), MiB.\n"
    );
    let mut head = String::from("| model | test |");
    let mut rule = String::from("|---|---|");
    for e in &engines {
        let _ = write!(head, " {} |", crate::format::md_text(e));
        rule.push_str("--:|");
    }
    for e in &others {
        let _ = write!(head, " lockstep / {} |", crate::format::md_text(e));
        rule.push_str("--:|");
    }
    let _ = writeln!(md, "{head}\n{rule}");
    let mut keys: Vec<(&str, Test)> = Vec::new();
    for x in &r.results {
        let k = (x.model.as_str(), Test::of(x));
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (model, test) in keys {
        let of = |e: &str| {
            r.results
                .iter()
                .find(|x| x.engine == e && x.model == model && Test::of(x) == test)
                .and_then(|x| x.peak_rss_bytes)
        };
        let mut line = format!("| {} | {} |", crate::format::md_text(model), test.name());
        for e in &engines {
            let _ = write!(line, " {} |", mib(of(e)));
        }
        for e in &others {
            match (of("lockstep"), of(e)) {
                (Some(a), Some(b)) => {
                    let _ = write!(line, " {:.3} |", a as f64 / b as f64);
                }
                _ => line.push_str(" - |"),
            }
        }
        let _ = writeln!(md, "{line}");
    }
}

/// `bench.csv`: one row per result, llama-bench's CSV fields (`build_commit` first and `test_time` before the
/// timings, as llama-bench orders them) plus ours (written with the `csv` crate,
/// [`crate::format::CsvDoc`]).
///
/// Errors: only a record of the wrong width (a bug).
pub fn render_bench_csv(r: &BenchReport) -> anyhow::Result<String> {
    let mut out = crate::format::CsvDoc::with_header(
        "build_commit,engine,mode,simd,model,model_filename,model_type,model_size,model_n_params,n_threads,n_prompt,n_gen,n_depth,type_k,type_v,flash_attn,test_time,avg_ns,stddev_ns,avg_ts,stddev_ts,median_ts,peak_rss_bytes,host_simd"
            .split(','),
    )?;
    for x in &r.results {
        out.row([
            x.build_commit.clone(),
            x.engine.clone(),
            x.mode.clone(),
            x.simd.clone(),
            x.model.clone(),
            x.model_filename.clone(),
            x.model_type.clone(),
            x.model_size.to_string(),
            x.model_n_params.to_string(),
            x.n_threads.to_string(),
            x.n_prompt.to_string(),
            x.n_gen.to_string(),
            x.n_depth.to_string(),
            x.type_k.clone(),
            x.type_v.clone(),
            x.flash_attn.clone(),
            x.test_time.clone(),
            x.avg_ns.to_string(),
            x.stddev_ns.to_string(),
            x.avg_ts.to_string(),
            x.stddev_ts.to_string(),
            x.median_ts.to_string(),
            x.peak_rss_bytes.map_or_else(String::new, |b| b.to_string()),
            r.host_simd.clone(),
        ])?;
    }
    out.finish()
}
