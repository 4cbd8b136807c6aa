//! `lockstep publish REPORTS_DIR --out SITE`: a static site over the reports a checkout has written — no
//! server, no JavaScript, plain HTML and one stylesheet, SVG charts drawn with plotters as the report's
//! plots are — that any static host serves or a browser opens from disk.
//!
//! Layout (stable URLs, every link relative):
//!
//! | path | what |
//! |---|---|
//! | `index.html` | every run, newest first: run id, date, commit, CPU, verdict, cells passed, links |
//! | `runs/<run id>/index.html` (the id made a safe, unique name) | one run ([`run_page`]): summary table with failures first, each cell's error-vs-depth plot, bisect verdicts, SIMD vs scalar, rounding probe, cross-oracle table |
//! | `runs/<run id>/plots/*.svg` | the cells' plots, drawn again from report.json |
//! | `runs/<run id>/report.{json,md}`, `results.csv` | the report's own files, copied |
//! | `bench.html` | lockstep vs llama.cpp per model and test over commits ([`bench_page`]), and the quantization-quality tables |
//! | `charts/*.svg` | the bench page's line charts |
//! | `style.css` | the stylesheet |
//!
//! Inputs: every directory of REPORTS_DIR holding a `report.json` (`lockstep run`, `lockstep merge`), a
//! `bench.json` (`lockstep bench`) or a `quality.json` (`lockstep quality`). Hidden directories (a
//! report being written, `.<id>.partial-*`) are passed over; a file that does not read is an error naming
//! it, never a skipped run. Inputs are regular files: a report directory or file that is a symbolic link,
//! a FIFO or a device is refused (the site would hold what a link points to). Two runs whose ids give one
//! directory name (`run:1`, `run/1`, an id given twice) each keep a page ([`run_dir_names`]). The site is
//! built in a temporary directory beside SITE (removed on an error or an interrupt) and renamed into
//! place, its files mode 0644 and directories 0755; an existing SITE is replaced only when it is a site
//! lockstep wrote (it holds [`SITE_MARKER`]) and never through a symbolic link.

mod bench_page;
mod html;
mod run_page;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::bench::BenchReport;
use crate::quality::report::QualityReport;
use crate::report::Report;

pub use html::esc;

/// The file that marks a directory as a site `lockstep publish` wrote (and may replace).
pub const SITE_MARKER: &str = ".lockstep-site";

/// One run found in REPORTS_DIR, with the report's own files to copy.
#[derive(Clone, Debug)]
pub struct RunInput {
    /// The report.
    pub report: Report,
    /// Its directory (report.md, results.csv are copied from there when present).
    pub dir: PathBuf,
}

/// Everything the site is made of.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// Runs, in any order (the index sorts them).
    pub runs: Vec<RunInput>,
    /// Bench reports.
    pub benches: Vec<BenchReport>,
    /// Quality reports.
    pub quality: Vec<QualityReport>,
}

/// What a publish wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// The site directory.
    pub site: PathBuf,
    /// Runs, benches and quality reports in it.
    pub runs: usize,
    /// Bench reports.
    pub benches: usize,
    /// Quality reports.
    pub quality: usize,
    /// Files written.
    pub files: usize,
}

/// An input file of the site: absent (`None`), or a regular file (`Some(path)`). A symbolic link is
/// refused (publish would put what it points to — a secret, `/etc/passwd` — into a world-readable site),
/// and so is anything else that is not a regular file (a FIFO would hang the read or, passed over, lose
/// a run).
///
/// Errors name the file and what it is.
fn input_file(path: &Path) -> Result<Option<PathBuf>> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        Ok(m) if m.file_type().is_symlink() => bail!(
            "{}: is a symbolic link; publish copies only regular files (the site would hold what the \
             link points to): replace the link with the file itself",
            path.display()
        ),
        Ok(m) if !m.is_file() => bail!(
            "{}: is not a regular file (a directory, FIFO, device or socket); publish never skips a \
             report: remove it or replace it with the report file",
            path.display()
        ),
        Ok(_) => Ok(Some(path.to_path_buf())),
    }
}

/// Read every report under `reports_dir` (see the module docs).
///
/// Errors: `reports_dir` unreadable; a report directory that is a symbolic link; a report.json,
/// bench.json or quality.json that is a symbolic link, not a regular file, or does not parse (naming the
/// file).
pub fn read_inputs(reports_dir: &Path) -> Result<Inputs> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(reports_dir)
        .with_context(|| {
            format!(
                "cannot read the reports directory {}",
                reports_dir.display()
            )
        })?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot list {}", reports_dir.display()))?;
    dirs.sort();
    let mut inputs = Inputs::default();
    for d in dirs {
        let hidden = d
            .file_name()
            .and_then(|n| n.to_str())
            .is_none_or(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        let meta = std::fs::symlink_metadata(&d)
            .with_context(|| format!("cannot read {}", d.display()))?;
        if meta.file_type().is_symlink() && d.is_dir() {
            bail!(
                "{}: is a symbolic link to a directory; publish reads only the report directories \
                 themselves (the site would hold what the link points to)",
                d.display()
            );
        }
        if !meta.is_dir() {
            continue;
        }
        if let Some(report) = input_file(&d.join(crate::report::REPORT_JSON))? {
            inputs.runs.push(RunInput {
                report: crate::report::read_report(&report)?,
                dir: d.clone(),
            });
        }
        if let Some(bench) = input_file(&d.join("bench.json"))? {
            inputs.benches.push(crate::bench::read_bench(&bench)?);
        }
        if let Some(quality) = input_file(&d.join("quality.json"))? {
            let text = crate::input::read_string(
                &quality,
                "the quality report",
                crate::input::MAX_REPORT_BYTES,
            )?;
            inputs.quality.push(
                crate::report::from_json(&text)
                    .with_context(|| format!("{} is not a quality report", quality.display()))?,
            );
        }
    }
    Ok(inputs)
}

/// The directory name of a run in the site: its run id made one safe file-name component (two ids may
/// give one name, `run:1` and `run/1`: [`run_dir_names`] tells them apart).
pub fn run_dir_name(run_id: &str) -> String {
    crate::output::file_stem(run_id)
}

/// The directory names of `runs` (in that order) in the site: [`run_dir_name`], made unique — the second
/// run whose id gives a name already taken (its id sanitized to the same name, or the same id twice)
/// gets `-2`, the third `-3`, …, compared without case (a case-insensitive file system keeps them
/// apart too), so every run keeps a page of its own.
pub fn run_dir_names(runs: &[&Report]) -> Vec<String> {
    let mut taken = std::collections::BTreeSet::new();
    runs.iter()
        .map(|r| {
            let base = run_dir_name(&r.run_id);
            let mut name = base.clone();
            let mut n = 1;
            while !taken.insert(name.to_ascii_lowercase()) {
                n += 1;
                name = format!("{base}-{n}");
            }
            name
        })
        .collect()
}

/// Render the whole site: relative path → bytes.
///
/// Errors: a chart or plot the drawing backend refuses (not expected), a report file that cannot be
/// copied (naming it).
pub fn render_site(inputs: &Inputs) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files: Vec<(String, Vec<u8>)> = vec![
        ("style.css".into(), html::STYLE_CSS.as_bytes().to_vec()),
        (
            SITE_MARKER.into(),
            b"written by lockstep publish; the directory is replaced by the next publish\n"
                .to_vec(),
        ),
    ];
    let mut runs: Vec<&RunInput> = inputs.runs.iter().collect();
    // newest first; ties by run id
    runs.sort_by(|a, b| {
        b.report
            .created_unix
            .cmp(&a.report.created_unix)
            .then_with(|| b.report.run_id.cmp(&a.report.run_id))
    });
    let reports: Vec<&Report> = runs.iter().map(|r| &r.report).collect();
    let names = run_dir_names(&reports);
    files.push((
        "index.html".into(),
        index_page(&reports, &names).into_bytes(),
    ));
    for (run, name) in runs.iter().zip(&names) {
        let base = format!("runs/{name}");
        let mut copied = Vec::new();
        for name in [
            crate::report::REPORT_JSON,
            crate::report::REPORT_MD,
            crate::report::RESULTS_CSV,
        ] {
            if let Some(src) = input_file(&run.dir.join(name))? {
                let bytes = std::fs::read(&src)
                    .with_context(|| format!("cannot read {}", src.display()))?;
                files.push((format!("{base}/{name}"), bytes));
                copied.push(name);
            }
        }
        for (rel, bytes) in run_page::render(&run.report, &copied)? {
            files.push((format!("{base}/{rel}"), bytes));
        }
    }
    files.extend(bench_page::render(&inputs.benches, &inputs.quality)?);
    Ok(files)
}

/// The index page: one row per run (newest first); `dirs` are the runs' directory names
/// ([`run_dir_names`]).
fn index_page(runs: &[&Report], dirs: &[String]) -> String {
    let mut rows = Vec::new();
    for (r, dir) in runs.iter().zip(dirs) {
        let n = r.cells.len();
        let failed = r.cells.iter().filter(|c| !c.verdict.pass).count();
        let pass = failed == 0 && r.incomplete.is_none();
        let env = &r.environment;
        let commit: String = env.git_commit.chars().take(12).collect();
        let mut kind = Vec::new();
        if r.incomplete.is_some() {
            kind.push("incomplete".to_string());
        }
        if let Some(s) = &r.shard {
            kind.push(format!("shard {}/{}", s.index, s.count));
        }
        if !r.merged_from.is_empty() {
            kind.push(format!("merged from {} shards", r.merged_from.len()));
        }
        rows.push(vec![
            html::td(format!(
                "<a href=\"runs/{d}/index.html\"><code>{id}</code></a>{k}",
                d = esc(dir),
                id = esc(&r.run_id),
                k = if kind.is_empty() {
                    String::new()
                } else {
                    format!(" <span class=\"muted\">({})</span>", esc(&kind.join(", ")))
                }
            )),
            html::td(esc(&crate::format::fmt_utc(r.created_unix))),
            html::td(format!(
                "<code>{}</code>{}",
                esc(&commit),
                if env.git_dirty { " (dirty)" } else { "" }
            )),
            html::td(esc(&env.cpu_model)),
            html::td(html::verdict(pass)),
            html::td_num(format!("{}/{n}", n - failed)),
        ]);
    }
    let body = if rows.is_empty() {
        "<p>No runs in the reports directory.</p>\n".to_string()
    } else {
        format!(
            "<p>{} runs, newest first. <a href=\"bench.html\">Benchmarks over commits</a>.</p>\n{}",
            runs.len(),
            html::table(
                &["run", "date", "commit", "CPU", "verdict", "cells passed"],
                &rows
            )
        )
    };
    html::page("lockstep runs", "", &body)
}

/// `lockstep publish`: read `reports_dir`, render the site and write it to `out` atomically (see the
/// module docs).
///
/// Errors: those of [`read_inputs`] and [`render_site`]; `out` exists and is not a lockstep site (it is
/// never replaced then); the site cannot be written (naming the path).
pub fn publish(reports_dir: &Path, out: &Path) -> Result<Published> {
    // --out first, before any work: never a symbolic link (renaming over it would replace the link, and
    // the older site it points to would stay), never a directory lockstep did not write
    match out.symlink_metadata() {
        Ok(m) if m.file_type().is_symlink() => bail!(
            "--out {}: is a symbolic link; give the site directory itself (publish replaces the \
             directory it names and would replace the link, not the site it points to)",
            out.display()
        ),
        Ok(_) if !out.join(SITE_MARKER).is_file() => bail!(
            "--out {}: exists and is not a site lockstep publish wrote (no {SITE_MARKER}); give a new \
             directory or remove it",
            out.display()
        ),
        _ => {}
    }
    let inputs = read_inputs(reports_dir)?;
    let files = render_site(&inputs)?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    let name = out
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("--out {}: needs a directory name", out.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.partial-"))
        .tempdir_in(&parent)
        .with_context(|| {
            format!(
                "cannot create a temporary directory in {}",
                parent.display()
            )
        })?;
    // an interrupt removes the half-written site too (not only an error return)
    let registered = crate::process::register_temp(tmp.path());
    // the modes of a site any static host serves, whatever the umask and the sources' modes
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m))
            .with_context(|| format!("cannot set the mode of {}", p.display()))
    };
    mode(tmp.path(), 0o755)?;
    for (rel, bytes) in &files {
        if rel
            .split('/')
            .any(|c| c.is_empty() || c == ".." || c == ".")
        {
            bail!("internal: site path {rel:?} is not a plain relative path");
        }
        let p = tmp.path().join(rel);
        if let Some(d) = p.parent().filter(|d| !d.is_dir()) {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
            let mut up = d;
            while up != tmp.path() {
                mode(up, 0o755)?;
                up = up.parent().unwrap_or(tmp.path());
            }
        }
        std::fs::write(&p, bytes).with_context(|| format!("cannot write {}", p.display()))?;
        mode(&p, 0o644)?;
    }
    // swap: the old site (if any) aside, the new one in, the old one removed
    let old = if out.exists() {
        let aside = parent.join(format!(".{name}.old-{}", std::process::id()));
        std::fs::rename(out, &aside)
            .with_context(|| format!("cannot move the old site {} aside", out.display()))?;
        Some(aside)
    } else {
        None
    };
    let tmp_path = tmp.keep();
    let renamed = registered.commit(|| std::fs::rename(&tmp_path, out));
    if let Err(e) = renamed {
        if let Some(a) = &old {
            let _ = std::fs::rename(a, out);
        }
        let _ = std::fs::remove_dir_all(&tmp_path);
        return Err(e)
            .with_context(|| format!("cannot move the site into place at {}", out.display()));
    }
    if let Some(a) = old {
        let _ = std::fs::remove_dir_all(a);
    }
    Ok(Published {
        site: out.to_path_buf(),
        runs: inputs.runs.len(),
        benches: inputs.benches.len(),
        quality: inputs.quality.len(),
        files: files.len(),
    })
}
