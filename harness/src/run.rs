//! `lockstep run`: the matrix of cells, each run against its golden, compared, gated and reported.
//!
//! Per cell: verify the golden against the manifest (file present, sha256, array shapes), refuse it if
//! its model sha256 is not the model about to run, tokenize the golden's prompt with the engine, run the
//! golden's tokens as one prefill and then the golden's continuation one token per step through the KV
//! cache (teacher forcing), record every stage, compare ([`crate::compare`]), and gate ([`crate::gate`]).
//! The cell's tokens/s are that pass's own wall time, stage recording included (within the run-to-run
//! noise on the scalar kernels, up to ~20% on the fastest SIMD ones); `lockstep bench` measures speed
//! without hooks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use lockstep_engine::GgmlTarget;
use lockstep_engine::{Model, NumericsMode, Simd};

use crate::engine::{Engine, ExternalCommands, ExternalEngine, LockstepEngine};
use crate::gate::{evaluate, Thresholds};
use crate::golden::{self, GoldenFile, Manifest};
use crate::judge::Case;
use crate::matrix::{golden_path_for, Cell, Filters, Matrix};
use crate::protocol::client::{LoadRefused, ServeCommand, SessionEngine, StepFailed};
use crate::report::{self, CellReport, Environment, Report, Speed, REPORT_SCHEMA_VERSION};

/// Where things are and what to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The golden directory (holds `manifest.json`).
    pub golden_dir: PathBuf,
    /// The matrix file (`ci/matrix.toml`).
    pub matrix: PathBuf,
    /// The thresholds file (`ci/thresholds.toml`).
    pub thresholds: PathBuf,
    /// Where `reports/<run-id>/` is written.
    pub reports_root: PathBuf,
    /// Narrowing of the matrix.
    pub filters: Filters,
    /// Run this external engine instead of ours (for cells whose engine is `external`, or all cells
    /// when `force_external`).
    pub external: Option<ExternalCommands>,
    /// Treat every cell as an external-engine cell.
    pub force_external: bool,
    /// Run every cell through this session engine instead (`--engine-serve`: one long-lived child per
    /// cell speaking [`crate::protocol`], decoding through its own KV cache). Takes precedence over
    /// `external`.
    pub serve: Option<ServeCommand>,
    /// Report progress on stderr: a bar on a terminal, a line per finished cell and per fetched model
    /// elsewhere ([`crate::progress`]).
    pub progress: bool,
    /// Threads the engine uses (for the report).
    pub threads: usize,
    /// Mirror this ggml-cpu build in ggml mode instead of the one each golden's host CPU selects (to see
    /// what the other target's kernels change; a mismatched target is expected to break bit-exactness).
    pub ggml_target: Option<GgmlTarget>,
    /// The measured floors of modes that are not bit-exact (`ci/floors.json`).
    pub floors: PathBuf,
    /// Run only this shard of the expanded matrix ([`crate::shard`]), balanced by this cost table (`None`:
    /// by cell count).
    pub shard: Option<(crate::shard::ShardSpec, Option<crate::shard::CostTable>)>,
    /// `--cell`, `--rerun-failed` and the expected-failure list ([`crate::select`]).
    pub select: crate::select::Selection,
}

/// What a run will do, known before any cell runs: the parsed inputs and the selected cells.
pub struct Plan {
    /// The golden manifest.
    pub manifest: Manifest,
    /// The thresholds, checked to cover every cell.
    pub thresholds: Thresholds,
    /// The cells to run, in order (after the filters, `--cell`, `--rerun-failed` and the shard).
    pub cells: Vec<Cell>,
    /// The shard's record for the report (`None` without `--shard`).
    pub shard_info: Option<report::ShardInfo>,
}

/// Parse the manifest, matrix and thresholds and select the cells (`lockstep run --list` prints them).
/// Errors: an input that does not parse, thresholds that miss a cell, a filter that matches nothing,
/// `--rerun-failed` without a report. An empty selection is not an error here (the caller decides).
pub fn plan(opts: &RunOptions) -> Result<Plan> {
    let manifest = golden::load_manifest(&opts.golden_dir)?;
    let matrix = Matrix::load(&opts.matrix)?;
    let thresholds = Thresholds::load(&opts.thresholds)?;
    thresholds.validate_matrix(&matrix)?;
    let cells = matrix.expand(&manifest, &opts.filters)?;
    let cells = opts.select.apply(cells, &opts.reports_root)?;
    for cell in &cells {
        thresholds.for_cell(cell)?;
    }
    // a shard runs its part of the whole (filtered) matrix; an empty part still writes its (empty) report,
    // so that `lockstep merge` sees every shard
    let shard_info = opts.shard.as_ref().map(|(spec, costs)| report::ShardInfo {
        index: spec.index,
        count: spec.count,
        matrix_cells: cells.iter().map(Cell::id).collect(),
        balanced_by: costs
            .as_ref()
            .map_or_else(|| "cell count".to_string(), |c| c.source.clone()),
    });
    let cells: Vec<Cell> = match &opts.shard {
        None => cells,
        Some((spec, costs)) => crate::shard::assign(&cells, *spec, costs.as_ref())
            .into_iter()
            .map(|i| cells[i].clone())
            .collect(),
    };
    Ok(Plan {
        manifest,
        thresholds,
        cells,
        shard_info,
    })
}

/// Build an engine for a model path (overridable by tests to plug in a broken engine).
pub type EngineFactory<'a> = dyn FnMut(&Cell, &Path, &str) -> Result<Box<dyn Engine>> + 'a;

/// Run the matrix with the default engine factory (ours, or the external command), write the report.
/// Returns the report directory and the report.
pub fn run(opts: &RunOptions) -> Result<(PathBuf, Report)> {
    let external = opts.external.clone();
    let force = opts.force_external;
    let serve = opts.serve.clone();
    // the model of the previous cell: the matrix runs a model's cells one after the other, and loading
    // (the GGUF index, the tokenizer) is the same for each
    let mut loaded: Option<(PathBuf, Arc<Model>)> = None;
    let mut factory = move |cell: &Cell, model: &Path, arch: &str| -> Result<Box<dyn Engine>> {
        if let Some(cmd) = &serve {
            // the mode of the cell; reset sets the golden's target before the first step
            Ok(Box::new(SessionEngine::start(
                cmd.clone(),
                model,
                arch,
                cell.mode,
                GgmlTarget::default(),
            )?))
        } else if force || cell.engine == "external" {
            let cmds = external.clone().context(
                "the matrix has an `external` engine cell but no --engine-serve or --engine-cmd was given",
            )?;
            Ok(Box::new(ExternalEngine::new(cmds, model, arch)?))
        } else {
            let simd = Simd::parse(&cell.simd).with_context(|| format!("cell {}", cell.id()))?;
            let shared = match &loaded {
                Some((p, m)) if p == model => m.clone(),
                _ => {
                    let m = LockstepEngine::load_model(model)?;
                    loaded = Some((model.to_path_buf(), m.clone()));
                    m
                }
            };
            Ok(Box::new(
                LockstepEngine::shared(shared, model.to_path_buf()).with_simd(simd),
            ))
        }
    };
    run_with(opts, &mut factory)
}

/// [`run`] with a custom engine factory.
///
/// Everything that can be checked is checked before the first cell runs, so that no finished work is
/// thrown away by a late error: the manifest, matrix and thresholds files parse; the thresholds cover
/// every (model, mode, oracle) of the whole matrix; the reports directory is writable; every selected
/// golden matches its manifest entry (sha256, arrays, contents: [`golden::verify_golden`]). If a cell still
/// fails (the engine errors, say), the cells already finished are written as a report marked
/// [`Report::incomplete`] and the error says where.
pub fn run_with(opts: &RunOptions, factory: &mut EngineFactory<'_>) -> Result<(PathBuf, Report)> {
    let Plan {
        manifest,
        thresholds,
        cells,
        shard_info,
    } = plan(opts)?;
    let whole_is_empty = shard_info
        .as_ref()
        .map_or(cells.is_empty(), |s| s.matrix_cells.is_empty());
    if whole_is_empty && opts.select.rerun_failed {
        return Err(NothingToRerun.into());
    }
    if whole_is_empty {
        bail!("the matrix {} selects no cells", opts.matrix.display());
    }
    report::check_reports_dir(&opts.reports_root)?;
    let mut verified = std::collections::BTreeSet::new();
    for cell in &cells {
        let gpath = golden_path_for(cell);
        let entry = golden_entry(opts, &manifest, &gpath)?;
        if verified.insert(gpath.clone()) {
            golden::verify_golden(&opts.golden_dir, entry)?;
        }
        let mode = cell.mode;
        if mode == NumericsMode::Ggml && opts.ggml_target.is_none() {
            entry
                .oracle
                .ggml_target()
                .with_context(|| format!("golden {gpath} (cell {})", cell.id()))?;
        }
        if opts.serve.is_some() || opts.force_external || cell.engine == "external" {
            if opts.external.is_none() && opts.serve.is_none() {
                bail!(
                    "cell {} runs an external engine but no --engine-serve or --engine-cmd was given",
                    cell.id()
                );
            }
            if cell.simd != "off" {
                bail!(
                    "cell {}: the SIMD axis is lockstep's own kernel setting; an external engine runs \
                     the `off` cells only (narrow with --simd off)",
                    cell.id()
                );
            }
        } else {
            // a setting this CPU cannot run fails here, not after the cells before it
            Simd::parse(&cell.simd).map_err(|e| anyhow::anyhow!("cell {}: {e}", cell.id()))?;
        }
    }
    let inputs = run_inputs(opts)?;
    let run_id = report::new_run_id();
    let created_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());

    let display = crate::progress::Display::for_stderr(opts.progress);
    // every model and variant the cells need, fetched or made and hashed before the first cell: a model
    // that cannot be had fails the run here, naming it, not after the cells before it ran
    let model_cache = resolve_models(&cells, display)?;
    let mut bar = crate::progress::Progress::new(cells.len(), display);
    let mut reports = Vec::with_capacity(cells.len());
    let mut failure = None;
    // the name the session engine gave in its last successful `load`: a refused `load` that gives none
    // names its cells after it
    let mut session_name: Option<String> = None;
    for (i, cell) in cells.iter().enumerate() {
        bar.start(&cell.id());
        let cell_start = Instant::now();
        if crate::process::interrupted() {
            failure = Some((
                anyhow::anyhow!("interrupted (Ctrl-C) before cell {} ran", cell.id()),
                i,
            ));
            break;
        }
        let result = (|| {
            let (model_path, model_sha) = model_cache
                .get(&cell.model)
                .with_context(|| format!("model {} was not resolved", cell.model))?;
            run_cell(
                opts,
                &manifest,
                &thresholds,
                cell,
                model_path,
                model_sha,
                factory,
            )
        })();
        match result {
            Ok(mut r) => {
                r.seconds = Some(cell_start.elapsed().as_secs_f64());
                bar.finish(&r.cell.id(), verdict_word(&r), cell_start.elapsed());
                if opts.serve.is_some() {
                    session_name = Some(r.cell.engine.clone());
                }
                reports.push(r)
            }
            // the engine cannot run this model (a weight type without kernels, a session engine's refused
            // or failed `load`): this cell fails with the engine's error, named after that engine, and the
            // others still run
            Err(e) if cell_failure(&e).is_some() && !crate::process::interrupted() => {
                let named = cell_failure(&e).flatten();
                let engine = match (named, &opts.serve) {
                    (Some(n), _) => n,
                    (None, Some(cmd)) => {
                        session_name.clone().unwrap_or_else(|| cmd.fallback_name())
                    }
                    (None, None) => cell.engine.clone(),
                };
                let mut r = engine_error_cell(opts, &manifest, &thresholds, cell, &engine, &e)?;
                r.seconds = Some(cell_start.elapsed().as_secs_f64());
                bar.finish(&r.cell.id(), verdict_word(&r), cell_start.elapsed());
                reports.push(r);
            }
            Err(e) => {
                let e = if crate::process::interrupted() {
                    e.context(format!("cell {} (interrupted by Ctrl-C)", cell.id()))
                } else {
                    e.context(format!("cell {}", cell.id()))
                };
                failure = Some((e, i));
                break;
            }
        }
    }
    bar.clear();
    report::gate_simd_identity(&mut reports);
    for r in &mut reports {
        r.expected_failure = opts.select.expected.find(&r.cell.id()).cloned();
    }
    let incomplete = failure.as_ref().map(|(e, i)| report::Incomplete {
        failed_cell: cells[*i].id(),
        error: format!("{e:#}"),
        cells_not_run: cells.len() - i - 1,
    });
    let report = Report {
        schema_version: REPORT_SCHEMA_VERSION,
        run_id,
        created_unix,
        environment: Environment::detect(
            opts.threads,
            &opts.golden_dir.join(golden::MANIFEST_FILE),
        ),
        metric_definitions: report::metric_definitions(),
        thresholds_file: Some(opts.thresholds.display().to_string()),
        inputs: Some(inputs),
        incomplete,
        shard: shard_info,
        merged_from: Vec::new(),
        cells: reports,
    };
    match failure {
        None => {
            let dir = report::write_report(&opts.reports_root, &report)?;
            Ok((dir, report))
        }
        // nothing finished: nothing to save, but the CI outputs still say why the run stopped
        Some((e, 0)) => Err(e.context(Stopped {
            message: "the run stopped before any cell finished; no report is saved".into(),
            dir: None,
            report: Box::new(report),
        })),
        Some((e, _)) => {
            let n = report.cells.len();
            let (message, dir) = match report::write_report(&opts.reports_root, &report) {
                Ok(dir) => (
                    format!(
                        "the run stopped; the {n} cells finished before are saved in {} (marked \
                         incomplete)",
                        dir.display()
                    ),
                    Some(dir),
                ),
                Err(w) => (
                    format!(
                        "the run stopped, and saving the {n} cells finished before failed too: {w:#}"
                    ),
                    None,
                ),
            };
            Err(e.context(Stopped {
                message,
                dir,
                report: Box::new(report),
            }))
        }
    }
}

/// `--rerun-failed` found no failed cell of the last report in the selected matrix: nothing to run, and
/// not a failure (`lockstep run` says so and exits 0, as pytest's `--last-failed` does after a green run).
#[derive(Debug)]
pub struct NothingToRerun;

impl std::fmt::Display for NothingToRerun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "--rerun-failed: the last report has no failed cell in the selected matrix; nothing to rerun",
        )
    }
}

impl std::error::Error for NothingToRerun {}

/// The context of the error of a run that stopped early (an engine failure, Ctrl-C): the report of the
/// cells it finished, marked incomplete, and where it was saved — so the caller still writes the CI
/// outputs (`--junit` with its `(run)` error testcase, the step summary) of a run that did not finish.
/// Displayed as the sentence saying where the finished cells are. Reach it with
/// `error.downcast_ref::<Stopped>()`.
#[derive(Debug)]
pub struct Stopped {
    /// What happened to the finished cells (saved where, or why not).
    pub message: String,
    /// The saved report directory, when it was written.
    pub dir: Option<PathBuf>,
    /// The report of the finished cells (`incomplete` set).
    pub report: Box<Report>,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// `PASS` or `FAIL`, for the progress line of a finished cell.
fn verdict_word(r: &CellReport) -> &'static str {
    if r.verdict.pass {
        "PASS"
    } else {
        "FAIL"
    }
}

/// Every distinct model of `cells`, resolved ([`crate::fetch::resolve_model`]: a registered model fetched, a
/// variant made, a path checked) and hashed, in the order of first use; one progress line per model.
///
/// Errors: the first model that cannot be had, named (with the fetch or quantize error under it).
fn resolve_models(
    cells: &[Cell],
    display: crate::progress::Display,
) -> Result<BTreeMap<String, (PathBuf, String)>> {
    let steps = crate::progress::Progress::new(0, display);
    let mut out = BTreeMap::new();
    for cell in cells {
        if out.contains_key(&cell.model) {
            continue;
        }
        if crate::process::interrupted() {
            bail!("interrupted (Ctrl-C) while fetching the models");
        }
        let t = Instant::now();
        let p = crate::fetch::resolve_model(&cell.model)
            .with_context(|| format!("model {} (needed by cell {})", cell.model, cell.id()))?;
        // a registered model or variant was just verified against the registry's sha256 by the fetch (its
        // sidecar stamp, or a rehash); a local path is hashed here
        let sha = match registered_sha256(&cell.model)? {
            Some(sha) => sha,
            None => crate::hash::sha256_model(&p)?,
        };
        steps.step(
            &format!("model {} ready: {}", cell.model, p.display()),
            t.elapsed(),
        );
        out.insert(cell.model.clone(), (p, sha));
    }
    Ok(out)
}

/// The registry's sha256 of a registered model, seeded model or variant id (`None` for a path), which
/// [`crate::fetch::resolve_model`] has checked the cached file against.
fn registered_sha256(spec: &str) -> Result<Option<String>> {
    if crate::fetch::is_path_spec(spec) {
        return Ok(None);
    }
    let registry = crate::registry::Registry::active()?;
    if let Some(sha) = registry.sha256(spec) {
        return Ok(Some(sha.to_string()));
    }
    // not registered: the lookup error lists the known ids
    Ok(Some(registry.lookup(spec)?.sha256.clone()))
}

/// Whether `e` fails one cell and lets the run go on: the engine does not implement something the model
/// uses ([`lockstep_engine::Error::Unsupported`] anywhere in its chain), a session engine's `load`
/// refused or failed the model ([`LoadRefused`]), or a session engine answered a later request with
/// `ok: false` ([`StepFailed`]). `Some(name)`: yes, with the engine's name when the
/// error carries it ([`RanBy`], or the refused `load`'s `engine`).
fn cell_failure(e: &anyhow::Error) -> Option<Option<String>> {
    if let Some(r) = e.chain().find_map(|c| c.downcast_ref::<LoadRefused>()) {
        return Some(r.engine.clone());
    }
    let unsupported = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<lockstep_engine::Error>(),
            Some(lockstep_engine::Error::Unsupported(_))
        ) || c.downcast_ref::<StepFailed>().is_some()
    });
    unsupported.then(|| e.downcast_ref::<RanBy>().map(|r| r.0.clone()))
}

/// The context of an error raised after a cell's engine started: the engine's name (the cell id's engine
/// field), so that a cell it fails is named after it.
#[derive(Debug)]
struct RanBy(String);

impl std::fmt::Display for RanBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "engine {}", self.0)
    }
}

/// The report of a cell the engine could not run: the error, the golden's tokens, no speed, the failing
/// verdict [`crate::gate::engine_error_verdict`], and `engine` (the engine that refused it) as the cell
/// id's engine field.
fn engine_error_cell(
    opts: &RunOptions,
    manifest: &Manifest,
    thresholds: &Thresholds,
    cell: &Cell,
    engine: &str,
    e: &anyhow::Error,
) -> Result<CellReport> {
    let mut cell = cell.clone();
    cell.engine = engine.to_string();
    let cell = &cell;
    let entry = golden_entry(opts, manifest, &golden_path_for(cell))?;
    let th = thresholds.for_cell(cell)?;
    let mut gf = GoldenFile::open(&opts.golden_dir, entry)?;
    let (tokens, decode_tokens) = gf.read_sequence()?;
    let error = format!("{e:#}");
    Ok(CellReport {
        cell: cell.clone(),
        model_sha256: entry.model_sha256.clone(),
        golden_path: entry.path.clone(),
        golden_sha256: entry.sha256.clone(),
        ggml_target: None,
        comparison: crate::compare::CellComparison {
            golden_tokens: tokens.clone(),
            engine_tokens: Vec::new(),
            stages: Vec::new(),
            not_compared: Vec::new(),
            logits: Vec::new(),
        },
        speed: Speed {
            prefill_tokens: tokens.len(),
            prefill_seconds: 0.0,
            decode_tokens: decode_tokens.len(),
            decode_seconds: 0.0,
        },
        verdict: crate::gate::engine_error_verdict(&error, &th),
        thresholds: Some(th),
        local_nmse_by_layer: Vec::new(),
        finding: None,
        output_sha256: None,
        error: Some(error),
        rounding_probe: None,
        seconds: None,
        expected_failure: None,
    })
}

fn golden_entry<'m>(
    opts: &RunOptions,
    manifest: &'m Manifest,
    gpath: &str,
) -> Result<&'m golden::GoldenEntry> {
    manifest.entry(&opts.golden_dir, gpath)
}

/// The run's inputs with their sha256, and the engine it runs (provenance for the report).
fn run_inputs(opts: &RunOptions) -> Result<report::RunInputs> {
    let file = |p: &Path| -> Result<report::FileRef> {
        Ok(report::FileRef {
            path: p.display().to_string(),
            sha256: crate::hash::sha256_file(p)?,
        })
    };
    let serve = opts.serve.as_ref();
    let external = opts
        .external
        .as_ref()
        .filter(|_| opts.force_external && serve.is_none());
    Ok(report::RunInputs {
        engine: if serve.is_some() {
            "session"
        } else if external.is_some() {
            "external"
        } else {
            "lockstep"
        }
        .into(),
        engine_cmd: external.map(|e| e.forward.clone()),
        engine_tokenize_cmd: external.map(|e| e.tokenize.clone()),
        engine_timeout_s: external
            .map(|e| e.timeout.as_secs_f64())
            .or(serve.map(|s| s.timeout.as_secs_f64())),
        engine_serve: serve.map(|s| s.command.clone()),
        stage_map: serve
            .and_then(|s| s.stage_map_file.as_ref())
            .map(|p| file(p))
            .transpose()?,
        kv_cache_note: external.map(|_| report::ONE_SHOT_KV_NOTE.to_string()),
        golden_dir: opts.golden_dir.display().to_string(),
        golden_manifest: file(&opts.golden_dir.join(golden::MANIFEST_FILE))?,
        matrix: file(&opts.matrix)?,
        thresholds: file(&opts.thresholds)?,
    })
}

/// Run one cell against its golden, which the caller has verified ([`golden::verify_golden`]; [`run_with`]
/// does it for every cell before the first runs).
pub fn run_cell(
    opts: &RunOptions,
    manifest: &Manifest,
    thresholds: &Thresholds,
    cell: &Cell,
    model_path: &Path,
    model_sha: &str,
    factory: &mut EngineFactory<'_>,
) -> Result<CellReport> {
    let entry = golden_entry(opts, manifest, &golden_path_for(cell))?;
    golden::check_model_for(&opts.golden_dir, entry, &cell.model, model_sha)?;
    let mut gf = GoldenFile::open(&opts.golden_dir, entry)?;
    let (tokens, decode_tokens) = gf.read_sequence()?;

    let mut engine = factory(cell, model_path, &entry.arch)?;
    // the cell is labelled with the engine that ran it: `lockstep`, `external` (a one-shot command), or
    // the name a session engine gave in `load`
    let mut cell = cell.clone();
    cell.engine = engine.info().kind;
    let name = cell.engine.clone();
    run_started_cell(
        opts,
        entry,
        thresholds,
        manifest,
        &cell,
        model_sha,
        &mut gf,
        engine.as_mut(),
        &tokens,
        &decode_tokens,
    )
    .map_err(|e| e.context(RanBy(name)))
}

/// [`run_cell`] once its engine started: capture, compare, judge and gate.
#[allow(clippy::too_many_arguments)]
fn run_started_cell(
    opts: &RunOptions,
    entry: &golden::GoldenEntry,
    thresholds: &Thresholds,
    manifest: &Manifest,
    cell: &Cell,
    model_sha: &str,
    gf: &mut GoldenFile,
    engine: &mut dyn Engine,
    tokens: &[u32],
    decode_tokens: &[u32],
) -> Result<CellReport> {
    let mode = cell.mode;
    let stage_map = manifest.stage_map(&entry.oracle.name, &entry.arch);
    let case = Case::new(gf, engine, stage_map, opts.ggml_target)?;
    // ggml mode mirrors the kernels of the CPU the golden was made on (reference mode ignores the target,
    // so a golden without a recorded CPU still serves it)
    let target = case.ggml_target(mode)?;
    let th = thresholds.for_cell(cell)?;
    let acc = case.accumulated(gf, engine, mode)?;
    if let Some(nf) = acc.non_finite() {
        bail!("{nf} (golden {})", gf.path().display());
    }
    // the first-divergent verdict, as `lockstep bisect` gives it (an engine whose stages can be replaced;
    // otherwise the accumulated pass's marker)
    let judged = if engine.replaces_stages() {
        let floors = crate::judge::floor_set(&opts.floors, &th, cell, entry)?;
        crate::judge::judge(&case, gf, engine, mode, &th, floors.as_ref(), &acc)?
    } else {
        crate::judge::Judged::accumulated_only(&case, engine, &th, acc.cmp.as_ref())
    };
    // the accumulated pass's own time (`lockstep bench` times the engine without hooks)
    let speed = Speed {
        prefill_tokens: tokens.len(),
        prefill_seconds: acc.out.prefill_seconds,
        decode_tokens: decode_tokens.len(),
        decode_seconds: acc.out.decode_seconds,
    };
    let output_sha256 = Some(acc.out.sha256());
    let comparison = acc.cmp.context("the accumulated pass was compared")?;

    let mut verdict = evaluate(cell, &comparison, &th);
    crate::gate::verdict::name_token_pieces(&mut verdict, &|id| engine.token_piece(id));
    // one answer per cell: the verdict's first divergent stage is the finding's, and a failing cell's
    // finding places its failure (as `lockstep bisect` does)
    let mut finding = judged.finding.clone();
    crate::judge::settle(&mut verdict, &mut finding, Some(&comparison), &th);
    // a failing reference cell: how much of its gap is llama.cpp's input rounding (informative)
    let rounding_probe = if crate::probe::wanted(mode, &verdict) {
        crate::probe::run(&case, gf, engine, cell, &th)?
    } else {
        None
    };
    Ok(CellReport {
        error: None,
        cell: cell.clone(),
        model_sha256: model_sha.to_string(),
        golden_path: entry.path.clone(),
        golden_sha256: entry.sha256.clone(),
        ggml_target: (mode == NumericsMode::Ggml).then(|| target.to_string()),
        comparison,
        speed,
        verdict,
        thresholds: Some(th),
        local_nmse_by_layer: judged.local_nmse_by_layer(),
        finding: Some(finding),
        output_sha256,
        rounding_probe,
        seconds: None,
        expected_failure: None,
    })
}
