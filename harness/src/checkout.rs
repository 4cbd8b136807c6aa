//! The lockstep checkout that gives a command line its default paths (golden/, ci/*.toml,
//! ci/floors.json, reports/): `--root`, `$LOCKSTEP_ROOT`, or the nearest checkout at or above the working
//! directory — never the directory the binary was built in.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The environment variable naming the checkout root ([`find_checkout_root`]).
pub const ROOT_ENV: &str = "LOCKSTEP_ROOT";

/// True when `dir` is the root of a lockstep checkout: it holds `models.toml` and a `ci/` directory.
pub fn is_checkout_root(dir: &Path) -> bool {
    dir.join("models.toml").is_file() && dir.join("ci").is_dir()
}

/// The checkout whose files give the default paths: `flag` (`--root`), else `env` (the value of
/// [`ROOT_ENV`]), else the nearest of `cwd` and its ancestors that [`is_checkout_root`]. A relative
/// `flag` or `env` is taken relative to `cwd`. Never the directory the binary was built in: a binary run
/// from elsewhere must not read, or overwrite, the files of the checkout it was compiled in. Returns the
/// root and where it came from (for the one line that says so).
///
/// Errors: `flag` or `env` is empty or not a checkout root (naming it); no checkout root at or above
/// `cwd` — with what to do instead.
pub fn find_checkout_root(
    flag: Option<&Path>,
    env: Option<&std::ffi::OsStr>,
    cwd: &Path,
) -> Result<(PathBuf, &'static str)> {
    let given = |p: &Path, what: &str, from: &'static str| -> Result<(PathBuf, &'static str)> {
        if p.as_os_str().is_empty() {
            bail!("{what} is empty; give the directory of a lockstep checkout");
        }
        let abs = cwd.join(p);
        if !is_checkout_root(&abs) {
            bail!(
                "{what} {}: not a lockstep checkout (its root holds models.toml and ci/)",
                p.display()
            );
        }
        Ok((abs, from))
    };
    if let Some(p) = flag {
        return given(p, "--root", "--root");
    }
    if let Some(v) = env {
        return given(Path::new(v), &format!("${ROOT_ENV}"), "$LOCKSTEP_ROOT");
    }
    match cwd.ancestors().find(|d| is_checkout_root(d)) {
        Some(d) => Ok((d.to_path_buf(), "found at or above the working directory")),
        None => bail!(
            "no lockstep checkout at or above the working directory {} (a checkout's root holds \
             models.toml and ci/): run lockstep inside a checkout, give --root DIR or set ${ROOT_ENV}, or \
             give the path itself",
            cwd.display()
        ),
    }
}

/// The default paths of one command line, from the checkout root ([`find_checkout_root`]), which is
/// looked up only when a default is needed and then named on stderr once.
#[derive(Debug, Default)]
pub struct Defaults {
    flag: Option<PathBuf>,
    root: std::cell::OnceCell<PathBuf>,
}

impl Defaults {
    /// Defaults for a command line with this `--root`.
    pub fn new(flag: Option<PathBuf>) -> Defaults {
        Defaults {
            flag,
            root: std::cell::OnceCell::new(),
        }
    }

    /// The checkout root; the first call prints `lockstep: default paths from the checkout <root>
    /// (<source>)` on stderr.
    ///
    /// Errors: as [`find_checkout_root`]; the working directory cannot be read.
    pub fn root(&self) -> Result<&Path> {
        if let Some(r) = self.root.get() {
            return Ok(r);
        }
        let cwd = std::env::current_dir().context("cannot read the working directory")?;
        let env = std::env::var_os(ROOT_ENV);
        let (root, from) = find_checkout_root(self.flag.as_deref(), env.as_deref(), &cwd)?;
        eprintln!(
            "lockstep: default paths from the checkout {} ({from})",
            root.display()
        );
        Ok(self.root.get_or_init(|| root))
    }

    /// `given`, or `<root>/<rel>` when it is `None`; `what` names the option in errors.
    ///
    /// Errors: `given` is `None` and no checkout root is found.
    pub fn path(&self, given: Option<PathBuf>, rel: &str, what: &str) -> Result<PathBuf> {
        match given {
            Some(p) => Ok(p),
            None => Ok(self
                .root()
                .with_context(|| format!("{what} not given: its default is <checkout>/{rel}"))?
                .join(rel)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkout(dir: &Path) -> PathBuf {
        let co = dir.join("co");
        std::fs::create_dir_all(co.join("ci")).unwrap();
        std::fs::write(co.join("models.toml"), "").unwrap();
        co
    }

    #[test]
    fn a_root_needs_models_toml_and_ci() {
        let dir = tempfile::tempdir().unwrap();
        let co = checkout(dir.path());
        assert!(is_checkout_root(&co));
        std::fs::remove_dir(co.join("ci")).unwrap();
        assert!(!is_checkout_root(&co));
    }

    #[test]
    fn the_flag_wins_over_the_environment_relative_to_cwd() {
        let dir = tempfile::tempdir().unwrap();
        let co = checkout(dir.path());
        let (r, from) = find_checkout_root(
            Some(Path::new("co")),
            Some(std::ffi::OsStr::new("/nonexistent")),
            dir.path(),
        )
        .unwrap();
        assert_eq!((r, from), (co, "--root"));
        let e = find_checkout_root(Some(Path::new("")), None, dir.path()).unwrap_err();
        assert!(e.to_string().contains("--root is empty"), "{e}");
    }

    #[test]
    fn a_given_path_needs_no_root() {
        let d = Defaults::new(Some(PathBuf::from("/nonexistent/not-a-checkout")));
        let p = d
            .path(Some(PathBuf::from("x.toml")), "ci/x.toml", "--x")
            .unwrap();
        assert_eq!(p, PathBuf::from("x.toml"));
        let e = d.path(None, "ci/x.toml", "--x").unwrap_err();
        assert!(
            format!("{e:#}").contains("--x not given: its default is <checkout>/ci/x.toml"),
            "{e:#}"
        );
    }

    #[test]
    fn defaults_join_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let co = checkout(dir.path());
        let d = Defaults::new(Some(co.clone()));
        assert_eq!(
            d.path(None, "golden", "--golden-dir").unwrap(),
            co.join("golden")
        );
        assert_eq!(d.root().unwrap(), co.as_path());
    }
}
