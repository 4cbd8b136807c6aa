//! Speed floors (`ci/speed-floors.toml`): each model and test's share of the machine's physical limit,
//! measured once by `lockstep bench --write-speed-floors`, and the gate that holds a later bench to them on
//! any machine (`lockstep gate --speed BENCH --speed-floors FILE`).
//!
//! A tokens/s figure means nothing on another machine; a fraction of that machine's own limit, measured in
//! the same run, travels: prefill as GFLOP/s over the f32 FMA peak ([`super::sample::test_flops`],
//! [`super::sample::measure_fma_peak`]), decode as bytes read per second over the read bandwidth
//! ([`super::sample::decode_bytes_per_token`], [`super::sample::measure_read_bandwidth`]). This is what a
//! CI machine without llama.cpp can still gate on: a kernel that falls back to scalar code, a lost
//! thread, a prefill that turned into token-by-token decoding — each loses far more of the machine than
//! the difference between two CPUs does.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::file::{read_capped, validate_bench};
use super::speed::{SpeedCheck, SpeedLimits};
use super::stats::bootstrap_ratio;
use super::{BenchReport, Test};

/// Version of the speed floors file's layout. 2 keeps the floors per host SIMD kind (`[[host]]`
/// sections); version 1 (one machine's floors, no kind) is refused with what to do.
pub const SPEED_FLOORS_SCHEMA_VERSION: u32 = 2;

/// The largest speed floors file read (one entry per model and test: a few hundred bytes each).
pub const MAX_SPEED_FLOORS_BYTES: u64 = 4 << 20;

/// `ci/speed-floors.toml`: the floors of each host SIMD kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeedFloors {
    /// [`SPEED_FLOORS_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// One per SIMD kind (`avx512`, `avx2`, `off`), each from its own bench run.
    pub host: Vec<HostFloors>,
}

/// The floors of one SIMD kind: what a bench whose lockstep rows ran these kernels is held to. An AVX2
/// host (`--simd auto` there) and `--simd avx2` on an AVX-512 host both run the AVX2 kernels, so both are
/// held to the `avx2` floors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostFloors {
    /// The SIMD setting of the lockstep rows measured ([`bench_simd_kind`]): `avx512`, `avx2` or `off`.
    pub simd: String,
    /// The bench run the floors come from.
    pub source_run: String,
    /// Its CPU model.
    pub cpu: String,
    /// Its engine threads.
    pub threads: usize,
    /// Its f32 FMA peak, FLOP/s (for a reader comparing machines; the gate uses each bench's own).
    pub fma_peak: f64,
    /// Its read bandwidth, bytes/s (likewise).
    pub read_bandwidth: f64,
    /// One per model and test of lockstep's rows.
    pub floor: Vec<SpeedFloor>,
}

/// The SIMD kind a bench's lockstep rows ran: the `simd` of its `lockstep` engine (`--simd`, `auto`
/// resolved to the host's best when the bench ran), which picks the floors it is held to.
///
/// Errors: no lockstep engine, or one without a SIMD setting, or one that is not `off`, `avx2` or
/// `avx512`.
pub fn bench_simd_kind(r: &BenchReport) -> Result<String> {
    let e =
        r.engines.iter().find(|e| e.engine == "lockstep").context(
            "the bench has no lockstep engine (engines), so no SIMD kind to pick floors by",
        )?;
    let simd = e
        .simd
        .as_deref()
        .context("the bench's lockstep engine records no SIMD setting (engines[].simd)")?;
    if !lockstep_engine::Simd::ALL.iter().any(|s| s.name() == simd) {
        bail!("the bench's lockstep engine ran SIMD {simd:?}, not one of off, avx2, avx512");
    }
    Ok(simd.to_string())
}

/// One model and test's share of the machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeedFloor {
    /// Model id or path, as the bench names it.
    pub model: String,
    /// Test name (`pp64`, `tg16`, `tg16 @ d64`).
    pub test: String,
    /// Prompt tests: the FLOPs the bench counted for the test (a bench that counts others is refused:
    /// the model or the count changed, so the floor no longer applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops: Option<f64>,
    /// Prompt tests: median GFLOP/s ÷ FMA peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction_of_fma_peak: Option<f64>,
    /// Generation tests: weight bytes one decode step reads (held equal likewise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_token: Option<u64>,
    /// Generation tests: median bytes/s ÷ read bandwidth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction_of_bandwidth: Option<f64>,
}

impl HostFloors {
    /// The floors of `r`'s lockstep rows, under the SIMD kind they ran ([`bench_simd_kind`]): each prompt
    /// test's fraction of the FMA peak, each generation test's fraction of the read bandwidth (what the
    /// bench recorded, checked by [`validate_bench`]).
    ///
    /// Errors: `r` invalid, or a version-1 bench (no FMA peak), or no SIMD kind.
    pub fn from_bench(r: &BenchReport) -> Result<HostFloors> {
        validate_bench(r)?;
        if r.schema_version < 2 {
            bail!("a version-1 bench has no FMA peak: measure again with this lockstep");
        }
        let mut floor = Vec::new();
        for x in r.results.iter().filter(|x| x.engine == "lockstep") {
            let test = Test::of(x).name();
            let mut f = SpeedFloor {
                model: x.model.clone(),
                test: test.clone(),
                flops: None,
                fraction_of_fma_peak: None,
                bytes_per_token: None,
                fraction_of_bandwidth: None,
            };
            if x.n_prompt > 0 {
                let c = r
                    .compute
                    .iter()
                    .find(|c| c.engine == "lockstep" && c.model == x.model && c.test == test)
                    .with_context(|| format!("no compute entry for {} {test}", x.model))?;
                f.flops = Some(c.flops);
                f.fraction_of_fma_peak = Some(c.fraction);
            } else {
                let b = r
                    .bandwidth
                    .iter()
                    .find(|b| b.engine == "lockstep" && b.model == x.model && b.test == test)
                    .with_context(|| format!("no bandwidth entry for {} {test}", x.model))?;
                f.bytes_per_token = Some(b.bytes_per_token);
                f.fraction_of_bandwidth = Some(b.fraction);
            }
            floor.push(f);
        }
        let floors = HostFloors {
            simd: bench_simd_kind(r)?,
            source_run: r.run_id.clone(),
            cpu: r.environment.cpu_model.clone(),
            threads: r.environment.threads,
            fma_peak: r.fma_peak,
            read_bandwidth: r.read_bandwidth,
            floor,
        };
        floors.validate("host[0]")?;
        Ok(floors)
    }

    /// Check one kind's floors (`at` names it in errors): the SIMD kind one of `off`, `avx2`,
    /// `avx512`; every fraction finite and in (0, 10] (a fraction above 10 of a measured limit is a
    /// broken file, not a fast engine); prompt tests with `flops` and `fraction_of_fma_peak` only,
    /// generation tests with `bytes_per_token` and `fraction_of_bandwidth` only; no model and test twice.
    /// Errors name the entry and field.
    pub fn validate(&self, at: &str) -> Result<()> {
        if !lockstep_engine::Simd::ALL
            .iter()
            .any(|s| s.name() == self.simd)
        {
            bail!("{at}.simd: {:?} is not one of off, avx2, avx512", self.simd);
        }
        if self.floor.is_empty() {
            bail!("{at}.floor: empty; a floors file without floors gates nothing");
        }
        let fraction = |at: &str, x: Option<f64>| -> Result<()> {
            match x {
                Some(v) if v.is_finite() && v > 0.0 && v <= 10.0 => Ok(()),
                Some(v) => bail!("{at}: {v:?} is not a fraction in (0, 10]"),
                None => bail!("{at}: missing"),
            }
        };
        let mut seen = std::collections::HashSet::new();
        for (i, f) in self.floor.iter().enumerate() {
            let at = format!("{at}.floor[{i}] ({} {})", f.model, f.test);
            if !seen.insert((f.model.as_str(), f.test.as_str())) {
                bail!("{at}: a second floor of this model and test");
            }
            let prompt = f.test.starts_with("pp");
            if !prompt && !f.test.starts_with("tg") {
                bail!("{at}.test: {:?} is neither a pp nor a tg test", f.test);
            }
            if prompt {
                fraction(
                    &format!("{at}.fraction_of_fma_peak"),
                    f.fraction_of_fma_peak,
                )?;
                match f.flops {
                    Some(v) if v.is_finite() && v > 0.0 => {}
                    other => bail!("{at}.flops: {other:?} is not a count above 0"),
                }
                if f.bytes_per_token.is_some() || f.fraction_of_bandwidth.is_some() {
                    bail!("{at}: a prompt test has no bytes_per_token or fraction_of_bandwidth");
                }
            } else {
                fraction(
                    &format!("{at}.fraction_of_bandwidth"),
                    f.fraction_of_bandwidth,
                )?;
                if f.bytes_per_token.is_none_or(|b| b == 0) {
                    bail!("{at}.bytes_per_token: missing or 0");
                }
                if f.flops.is_some() || f.fraction_of_fma_peak.is_some() {
                    bail!("{at}: a generation test has no flops or fraction_of_fma_peak");
                }
            }
        }
        Ok(())
    }
}

impl SpeedFloors {
    /// Check the file: the schema version, at least one kind, no kind twice, each kind's floors
    /// ([`HostFloors::validate`]). Errors name the section and field.
    pub fn validate(&self) -> Result<()> {
        if self.schema_version != SPEED_FLOORS_SCHEMA_VERSION {
            bail!(
                "schema_version: {} (this lockstep reads {SPEED_FLOORS_SCHEMA_VERSION})",
                self.schema_version
            );
        }
        if self.host.is_empty() {
            bail!("host: empty; a floors file without floors gates nothing");
        }
        for (i, h) in self.host.iter().enumerate() {
            if self.host[..i].iter().any(|o| o.simd == h.simd) {
                bail!("host[{i}]: a second section of SIMD kind {:?}", h.simd);
            }
            h.validate(&format!("host[{i}] ({})", h.simd))?;
        }
        Ok(())
    }

    /// The floors of SIMD kind `simd`, if the file has them.
    pub fn for_simd(&self, simd: &str) -> Option<&HostFloors> {
        self.host.iter().find(|h| h.simd == simd)
    }

    /// `self` (or a new file) with `new` in place of its section of the same SIMD kind, the other kinds
    /// kept (sections ordered by kind: `avx512`, `avx2`, `off`), so a bench on one kind of host remakes
    /// its own floors only.
    pub fn with_host(existing: Option<SpeedFloors>, new: HostFloors) -> SpeedFloors {
        let mut host = existing.map_or_else(Vec::new, |f| f.host);
        host.retain(|h| h.simd != new.simd);
        host.push(new);
        let rank = |s: &str| {
            lockstep_engine::Simd::ALL
                .iter()
                .rev()
                .position(|x| x.name() == s)
                .unwrap_or(usize::MAX)
        };
        host.sort_by_key(|h| rank(&h.simd));
        SpeedFloors {
            schema_version: SPEED_FLOORS_SCHEMA_VERSION,
            host,
        }
    }

    /// Read a floors file: at most [`MAX_SPEED_FLOORS_BYTES`] of a regular file, TOML, checked by
    /// [`SpeedFloors::validate`]. Errors name the file; a version-1 file (floors without a SIMD kind)
    /// says how to remake it.
    pub fn load(path: &Path) -> Result<SpeedFloors> {
        let text = read_capped(path, MAX_SPEED_FLOORS_BYTES, "speed floors file")?;
        let v: toml::Value = toml::from_str(&text)
            .with_context(|| format!("{} is not a speed floors file", path.display()))?;
        if let Some(n) = v.get("schema_version").and_then(toml::Value::as_integer) {
            if n != i64::from(SPEED_FLOORS_SCHEMA_VERSION) {
                bail!(
                    "{}: schema_version {n}, this lockstep reads {SPEED_FLOORS_SCHEMA_VERSION} (floors per \
                     host SIMD kind, [[host]] sections): remake it with `lockstep bench ... \
                     --write-speed-floors {}`",
                    path.display(),
                    path.display()
                );
            }
        }
        let f: SpeedFloors = v
            .try_into()
            .with_context(|| format!("{} is not a speed floors file", path.display()))?;
        f.validate()
            .map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))?;
        Ok(f)
    }

    /// The file's text: a comment saying where it comes from and how to remake it, then the TOML.
    pub fn to_toml(&self) -> Result<String> {
        Ok(format!(
            "# Speed floors: each model and test's share of the machine's physical limit (prefill: GFLOP/s ÷ the \
             f32 FMA peak;\n# decode: bytes/s ÷ the read bandwidth), both limits measured in the same bench run. \
             `lockstep gate --speed\n# BENCH --speed-floors ci/speed-floors.toml` fails a row whose interval's \
             upper end is below\n# (1 − max_slowdown_vs_floors of ci/speed.toml) × its floor. Written by \
             `lockstep bench ... --write-speed-floors`;\n# remake it after a change that makes the engine \
             faster or a model or test that is new (ci/test.sh's bench).\n# One [[host]] section per SIMD kind \
             of the lockstep rows (avx512, avx2): a bench is held to its own kind's\n# floors; writing one kind \
             keeps the others (`--simd avx2` on an AVX-512 host writes the avx2 section).\n\n{}",
            toml::to_string(self).context("cannot write the speed floors as TOML")?
        ))
    }
}

/// The floors gate: every lockstep row of `bench` against its floor among the floors of the SIMD kind the
/// bench's lockstep engine ran ([`bench_simd_kind`]; an AVX2 host and `--simd avx2` on an AVX-512 host
/// alike are held to the `avx2` floors) — per repetition, the row's share of
/// the limit this bench measured (prefill `tokens/s × flops ÷ n_prompt ÷ fma_peak`, decode
/// `tokens/s × bytes_per_token ÷ read_bandwidth`), its median over the floor with a 95% bootstrap
/// interval ([`bootstrap_ratio`]), failing when the interval's upper end is below
/// `1 − max_slowdown_vs_floors`.
///
/// Errors: `bench` invalid or a version-1 bench; no floors of the bench's SIMD kind; a lockstep row
/// without a floor or a floor without a row
/// (no check is dropped, none is invented); a row whose FLOPs or bytes per token differ from its floor's
/// (the model or the count changed: remake the floors).
pub fn gate_floors(
    bench: &BenchReport,
    floors: &SpeedFloors,
    limits: &SpeedLimits,
) -> Result<Vec<SpeedCheck>> {
    validate_bench(bench).context("the current bench")?;
    floors.validate()?;
    limits.validate()?;
    let kind = bench_simd_kind(bench)?;
    let Some(floors) = floors.for_simd(&kind) else {
        bail!(
            "no speed floors of SIMD kind {kind} (the file has {}): a bench is held to its own kind's floors; \
             measure them with `lockstep bench --simd {kind} ... --write-speed-floors FILE` (the other kinds \
             are kept)",
            floors
                .host
                .iter()
                .map(|h| h.simd.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    if bench.schema_version < 2 {
        bail!("a version-1 bench has no FMA peak to hold prefill to its floor: measure again");
    }
    let limit = 1.0 - limits.max_slowdown_vs_floors;
    let mut checks = Vec::new();
    let mut used = std::collections::HashSet::new();
    for x in bench.results.iter().filter(|x| x.engine == "lockstep") {
        let test = Test::of(x).name();
        let Some((i, f)) = floors
            .floor
            .iter()
            .enumerate()
            .find(|(_, f)| f.model == x.model && f.test == test)
        else {
            bail!(
                "no speed floor for {} {test}: every model and test of the bench has one (remake the floors \
                 with `lockstep bench ... --write-speed-floors` after adding a model or test)",
                x.model
            );
        };
        used.insert(i);
        let (norm, floor, what): (Vec<f64>, f64, &str) = if x.n_prompt > 0 {
            let c = bench
                .compute
                .iter()
                .find(|c| c.engine == "lockstep" && c.model == x.model && c.test == test)
                .with_context(|| format!("no compute entry for {} {test}", x.model))?;
            if f.flops != Some(c.flops) {
                bail!(
                    "{} {test}: the bench counts {} FLOPs, the floor {:?}: the model or the count changed, \
                     so the floor does not apply (remake the floors)",
                    x.model,
                    c.flops,
                    f.flops
                );
            }
            let per = c.flops / x.n_prompt as f64 / bench.fma_peak;
            (
                x.samples_ts.iter().map(|t| t * per).collect(),
                f.fraction_of_fma_peak.unwrap_or(f64::NAN),
                "fraction of FMA peak",
            )
        } else {
            let b = bench
                .bandwidth
                .iter()
                .find(|b| b.engine == "lockstep" && b.model == x.model && b.test == test)
                .with_context(|| format!("no bandwidth entry for {} {test}", x.model))?;
            if f.bytes_per_token != Some(b.bytes_per_token) {
                bail!(
                    "{} {test}: a decode step reads {} bytes, the floor's {:?}: the model changed, so the \
                     floor does not apply (remake the floors)",
                    x.model,
                    b.bytes_per_token,
                    f.bytes_per_token
                );
            }
            let per = b.bytes_per_token as f64 / bench.read_bandwidth;
            (
                x.samples_ts.iter().map(|t| t * per).collect(),
                f.fraction_of_bandwidth.unwrap_or(f64::NAN),
                "fraction of bandwidth",
            )
        };
        let ratio = bootstrap_ratio(&norm, &[floor], 2000);
        checks.push(SpeedCheck {
            what: format!("{} {test}", x.model),
            against: format!("lockstep {what} / floor"),
            ratio,
            limit,
            pass: ratio.2 >= limit,
        });
    }
    if let Some((_, f)) = floors
        .floor
        .iter()
        .enumerate()
        .find(|(i, _)| !used.contains(i))
    {
        bail!(
            "the floors hold {} {}, which the bench did not measure (every floor is checked: bench every \
             model and test of the floors file)",
            f.model,
            f.test
        );
    }
    Ok(checks)
}
