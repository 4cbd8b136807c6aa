//! The report directory: written atomically, read back with its schema checked, named by a unique run id.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::csv::render_csv;
use super::environment::git;
use super::json::{from_value, parse_value, to_json_pretty};
use super::markdown::render_markdown;
use super::plot::{error_vs_depth_svg, plot_error_svg, plot_file_name};
use super::{Report, REPORT_JSON, REPORT_MD, REPORT_SCHEMA_VERSION, RESULTS_CSV};
use crate::format::civil;

/// Write `report.json`, `report.md`, `results.csv` and one error-vs-depth SVG per cell (`plots/`) into
/// `reports_root/<run_id>/`, atomically: all are written into a temporary directory `reports_root/.<run_id>.partial-XXXX`, which is then
/// renamed into place. On any error nothing is left at `reports_root/<run_id>` (and the temporary
/// directory is removed). Refuses a run id that is empty, starts with `.` or holds a path separator, and
/// a report directory that already exists. Returns the report directory.
pub fn write_report(reports_root: &Path, r: &Report) -> Result<PathBuf> {
    let id = &r.run_id;
    if id.is_empty() || id.starts_with('.') || id.contains(['/', '\\']) || id == ".." {
        bail!("run id {id:?} cannot be a directory name (empty, starts with '.', or holds a path separator)");
    }
    // Render first: nothing touches the disk if rendering fails.
    let json = to_json_pretty(r).with_context(|| format!("report {id}: report.json"))?;
    let md = render_markdown(r);
    let csv = render_csv(r).with_context(|| format!("report {id}: results.csv"))?;
    let plots = r
        .cells
        .iter()
        .enumerate()
        // a cell without per-layer stages gets a sentence in report.md, not an empty frame
        .filter(|(_, c)| super::has_depth(c))
        .map(|(i, c)| {
            // a plot is a view of numbers report.json already holds: one that cannot be drawn must not
            // cost the report, so it is replaced by a page saying why
            let svg = error_vs_depth_svg(c).unwrap_or_else(|e| plot_error_svg(&format!("{e:#}")));
            (plot_file_name(i, c), svg)
        })
        .collect::<Vec<(String, String)>>();

    let files = [(REPORT_JSON, &json), (REPORT_MD, &md), (RESULTS_CSV, &csv)]
        .into_iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .chain(plots)
        .collect::<Vec<_>>();
    write_files_atomically(reports_root, id, &files)
}

/// Write `files` (relative path → text; one level of subdirectory allowed, e.g. `plots/x.svg`) into
/// `reports_root/<id>/` atomically: into a temporary `reports_root/.<id>.partial-XXXX` first, each file
/// synced, then renamed into place. On any error nothing is left at `reports_root/<id>`. Refuses a
/// directory that already exists.
pub fn write_files_atomically(
    reports_root: &Path,
    id: &str,
    files: &[(String, String)],
) -> Result<PathBuf> {
    if id.is_empty() || id.starts_with('.') || id.contains(['/', '\\']) || id == ".." {
        bail!("run id {id:?} cannot be a directory name (empty, starts with '.', or holds a path separator)");
    }
    std::fs::create_dir_all(reports_root).with_context(|| {
        format!(
            "cannot create the reports directory {}",
            reports_root.display()
        )
    })?;
    let dest = reports_root.join(id);
    if dest.symlink_metadata().is_ok() {
        bail!(
            "{} already exists; a report directory is never overwritten",
            dest.display()
        );
    }
    clean_stale_partials(reports_root);
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{id}.partial-"))
        .tempdir_in(reports_root)
        .with_context(|| {
            format!(
                "cannot create a temporary directory in {}",
                reports_root.display()
            )
        })?;
    let registered = crate::process::register_temp(tmp.path());
    for (name, text) in files {
        let p = tmp.path().join(name);
        if let Some(dir) = p.parent().filter(|d| !d.exists()) {
            std::fs::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
        // Durable before the rename makes the directory visible.
        std::fs::File::open(&p)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("cannot sync {}", p.display()))?;
    }
    if dest.symlink_metadata().is_ok() {
        bail!(
            "{} appeared while the report was being written; not overwritten",
            dest.display()
        );
    }
    let tmp_path = tmp.keep();
    if let Err(e) = registered.commit(|| std::fs::rename(&tmp_path, &dest)) {
        let _ = std::fs::remove_dir_all(&tmp_path);
        return Err(e)
            .with_context(|| format!("cannot move {} to {}", tmp_path.display(), dest.display()));
    }
    Ok(dest)
}

/// Read a `report.json` (or the `report.json` inside a report directory). Refuses a schema version other
/// than [`REPORT_SCHEMA_VERSION`] with a message saying which.
pub fn read_report(path: &Path) -> Result<Report> {
    let file = if path.is_dir() {
        path.join(REPORT_JSON)
    } else {
        path.to_path_buf()
    };
    let text = crate::input::read_string(&file, "the report", crate::input::MAX_REPORT_BYTES)?;
    let value = parse_value(&text)
        .map_err(|e| anyhow::anyhow!("{} is not valid JSON: {e}", file.display()))?;
    match value.get("schema_version").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(REPORT_SCHEMA_VERSION) => {}
        Some(v) => bail!(
            "{}: report schema_version is {v}, but this lockstep reads schema_version {REPORT_SCHEMA_VERSION}; \
             read it with the lockstep version that wrote it (environment.lockstep_version)",
            file.display()
        ),
        None => bail!("{}: no integer schema_version; is this a lockstep report.json?", file.display()),
    }
    from_value(value).with_context(|| {
        format!(
            "{} does not match report schema {REPORT_SCHEMA_VERSION}",
            file.display()
        )
    })
}

/// A new run id: `YYYYMMDD-HHMMSS-<short git commit>-<6 hex>` in UTC (`nogit` when the commit cannot be
/// read), e.g. `20261122-221501-53b3529-4f0a9c`. The suffix is a hash of the process id, the clock in
/// nanoseconds and a per-process counter, so runs started in the same second — in one process or in
/// several — get distinct ids.
pub fn new_run_id() -> String {
    use sha2::Digest;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (y, mo, d, h, mi, s) = civil(since.as_secs());
    let commit = git(&["rev-parse", "--short=7", "HEAD"]).unwrap_or_else(|| "nogit".to_string());
    let mut hasher = sha2::Sha256::new();
    hasher.update(std::process::id().to_le_bytes());
    hasher.update(since.as_nanos().to_le_bytes());
    hasher.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let suffix = hex::encode(&hasher.finalize()[..3]);
    format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}-{commit}-{suffix}")
}

/// How old a `.<run id>.partial-*` directory must be before [`write_report`] removes it as the leftover
/// of a killed writer (a writer holds one for well under a second).
pub const STALE_PARTIAL_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Remove `.*.partial-*` directories under `reports_root` older than [`STALE_PARTIAL_AGE`] (left by a
/// writer that was killed), saying so on stderr. Younger ones may belong to a run writing right now and
/// are left alone. Returns the directories removed. Best effort: an entry that cannot be read or removed
/// is skipped.
pub fn clean_stale_partials(reports_root: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(reports_root) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with('.') && name.contains(".partial-")) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_PARTIAL_AGE);
        if old && std::fs::remove_dir_all(e.path()).is_ok() {
            eprintln!(
                "lockstep: removed {}, left by a report writer that was killed",
                e.path().display()
            );
            removed.push(e.path());
        }
    }
    removed
}

/// Check, before a run starts, that reports can be written under `reports_root`: created if missing, a
/// real directory, writable ([`crate::output::check_dir_target`]). Errors name the directory.
pub fn check_reports_dir(reports_root: &Path) -> Result<()> {
    crate::output::check_dir_target(reports_root, "the reports directory")
}
