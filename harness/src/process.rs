//! Child processes the harness runs (external engines): each bounded by a timeout, in its own process
//! group, killed as a group on timeout and on Ctrl-C / SIGTERM, with its scratch directory removed.
//!
//! An external engine may hang, or spawn helpers of its own; a harness that waits forever, or leaves
//! orphans and temporary directories behind when a CI job is cancelled, loses results and machines. So:
//!
//! - [`run_bounded`] starts the command in a new process group (`setpgid(0, 0)` via
//!   `CommandExt::process_group`), sends its stdout and stderr to files (no pipe can fill up and block
//!   it), and polls it until it exits or the timeout passes; then `kill(-pgid, SIGKILL)` ends the whole
//!   group, grandchildren included.
//! - A helper that leaves the group (`setsid()`, `setpgid()`) escapes that kill, so every engine is also
//!   *contained*: lockstep makes itself the child subreaper of its descendants
//!   (`prctl(PR_SET_CHILD_SUBREAPER)`: an orphan is re-parented to lockstep, not to init), and every
//!   engine is started with its own tag in the environment ([`ENGINE_TAG_ENV`]). When an engine ends —
//!   exits, times out, is dropped or interrupted — [`sweep`] kills every process descending from it, every
//!   orphan re-parented to lockstep that carries its tag, and anything else still carrying its tag, and reaps
//!   the orphans, until none is left.
//! - [`install_interrupt_handler`] (called once by the binary) catches SIGINT, SIGTERM and SIGHUP: every
//!   live group is killed with everything it started, every registered scratch directory
//!   ([`ScratchGuard`]) removed, and the process exits with status 130.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Default time one external-engine call may take (30 min: a full-stage dump of the largest registered
/// model at 512 tokens by a slow scalar engine takes a few minutes here).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Most bytes of a child's stdout that are read (token ids of the longest context fit many times over).
pub const MAX_STDOUT_BYTES: u64 = 16 << 20;

/// Most bytes a child may write to stderr (a log gone wild must not fill the disk).
pub const MAX_STDERR_BYTES: u64 = 64 << 20;

/// Process groups of running children, killed on an interrupt. Held across `spawn` + registration, and
/// by the interrupt handler until it exits, so no child can start unregistered or after an interrupt.
static LIVE_GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());
/// Set (under `LIVE_GROUPS`) once an interrupt arrived: no new child may start.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Scratch directories and temporary files (a `.partial-*` output being written) removed on an interrupt.
static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the interrupt path holds until the process exits: the live groups (no new child may start) and
/// the registered scratch paths (no temporary output may be renamed into place: see
/// [`TempRegistration::commit`]).
pub struct HeldUntilExit {
    _groups: std::sync::MutexGuard<'static, Vec<i32>>,
    _scratch: std::sync::MutexGuard<'static, Vec<PathBuf>>,
}

/// Kill every live child group and remove every registered scratch directory (interrupt path). The
/// returned guards keep any new child from starting and any temporary output from being renamed into
/// place until the process exits.
pub fn kill_all_and_clean() -> HeldUntilExit {
    let groups = lock(&LIVE_GROUPS);
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
    for &pgid in groups.iter() {
        kill_group(pgid);
    }
    sweep(&groups, &Tag::all());
    let scratch = lock(&SCRATCH);
    for path in scratch.iter() {
        remove_scratch(path);
    }
    HeldUntilExit {
        _groups: groups,
        _scratch: scratch,
    }
}

/// Remove a registered scratch path: a directory with everything in it, or a file. The main thread may
/// still be writing into a directory while the interrupt handler removes it (a file created after the
/// listing makes `remove_dir_all` fail with "directory not empty"), so a directory is tried a few times.
fn remove_scratch(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            for _ in 0..20 {
                if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
}

/// A temporary file or directory that is not a [`ScratchGuard`] (an output being written before it is
/// renamed into place: quantize's `.partial-*`, an atomic write's `.tmp*`, publish's `.site.partial-*`),
/// registered so that an interrupt removes it; dropping the registration unregisters it (the owner has
/// renamed or removed the path itself).
#[must_use = "the path is unregistered when this is dropped"]
pub struct TempRegistration {
    path: PathBuf,
}

/// Register `path` for removal on an interrupt (see [`TempRegistration`]).
pub fn register_temp(path: &Path) -> TempRegistration {
    lock(&SCRATCH).push(path.to_path_buf());
    TempRegistration {
        path: path.to_path_buf(),
    }
}

impl TempRegistration {
    /// Run `rename` (the move of the temporary path into place) and unregister the path, both under the
    /// lock the interrupt handler takes: an interrupt either removes the temporary path before the rename
    /// (and the process exits before `rename` runs) or comes after it and finds the output complete and
    /// the path unregistered — never a renamed output the handler believes it removed.
    pub fn commit<R>(self, rename: impl FnOnce() -> R) -> R {
        let mut scratch = lock(&SCRATCH);
        let out = rename();
        scratch.retain(|d| d != &self.path);
        drop(scratch);
        // the path is unregistered already; Drop's retain finds nothing
        out
    }
}

impl Drop for TempRegistration {
    fn drop(&mut self) {
        let p = &self.path;
        lock(&SCRATCH).retain(|d| d != p);
    }
}

/// Whether an interrupt arrived (see [`install_interrupt_handler`]).
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Let the first interrupt stop the work gracefully instead of exiting at once (`lockstep run`, which
/// then saves the cells it finished).
pub fn set_graceful(on: bool) {
    GRACEFUL.store(on, std::sync::atomic::Ordering::SeqCst);
}

static GRACEFUL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Install the SIGINT/SIGTERM/SIGHUP handler (once per process; later calls do nothing).
///
/// By default an interrupt kills the live child groups, removes the scratch directories and exits with
/// status 130. After [`set_graceful`]`(true)` the first interrupt only stops new children from starting
/// and kills the live ones — the work in progress fails at once, and the caller, seeing [`interrupted`],
/// saves what it finished; a second interrupt exits at once.
pub fn install_interrupt_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let installed = ctrlc::set_handler(|| {
            let graceful = GRACEFUL.load(std::sync::atomic::Ordering::SeqCst);
            if graceful && !interrupted() {
                let groups = lock(&LIVE_GROUPS);
                INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
                for &pgid in groups.iter() {
                    kill_group(pgid);
                }
                sweep(&groups, &Tag::all());
                drop(groups);
                eprintln!(
                    "lockstep: interrupted; stopping and saving the finished cells (interrupt again to quit at once)"
                );
                return;
            }
            let _held_until_exit = kill_all_and_clean();
            eprintln!(
                "lockstep: interrupted; child processes killed, temporary files and directories removed"
            );
            std::process::exit(130);
        });
        if let Err(e) = installed {
            eprintln!("lockstep: warning: cannot install the interrupt handler: {e}");
        }
    });
}

/// End engine `pgid` (its group leader's pid) and everything it started: its process group killed, then
/// [`sweep`] for what left the group.
fn end_engine(pgid: i32, tag: &Tag) {
    kill_group(pgid);
    sweep(&[pgid], tag);
}

fn kill_group(pgid: i32) {
    #[cfg(unix)]
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
    #[cfg(not(unix))]
    let _ = pgid;
}

/// The environment variable every engine lockstep starts carries, with a value unique to that engine
/// (`<lockstep pid>-<n>`), inherited by whatever it starts: how [`sweep`] finds a helper that left the
/// engine's process group and lost its parent.
pub const ENGINE_TAG_ENV: &str = "LOCKSTEP_ENGINE_TAG";

/// Which tagged processes a [`sweep`] kills: one engine's, or (on an interrupt) every engine's of this
/// lockstep process.
struct Tag {
    /// `LOCKSTEP_ENGINE_TAG=<value>`, matched whole, or as a prefix when `prefix`.
    entry: String,
    prefix: bool,
}

impl Tag {
    /// A fresh tag for one engine.
    fn new() -> Tag {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Tag {
            entry: format!("{ENGINE_TAG_ENV}={}-{n}", std::process::id()),
            prefix: false,
        }
    }

    /// Every engine's tag of this lockstep process.
    fn all() -> Tag {
        Tag {
            entry: format!("{ENGINE_TAG_ENV}={}-", std::process::id()),
            prefix: true,
        }
    }

    fn value(&self) -> &str {
        &self.entry[ENGINE_TAG_ENV.len() + 1..]
    }

    /// Whether process `pid`'s environment carries this tag (false when it cannot be read).
    fn carried_by(&self, pid: i32) -> bool {
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            return false;
        };
        let want = self.entry.as_bytes();
        env.split(|&b| b == 0).any(|e| {
            if self.prefix {
                e.starts_with(want)
            } else {
                e == want
            }
        })
    }
}

/// Make lockstep the child subreaper of everything it starts (Linux `PR_SET_CHILD_SUBREAPER`; once per
/// process): a helper whose parent exits is re-parented to lockstep, where [`sweep`] finds it.
fn become_subreaper() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(target_os = "linux")]
        // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes no pointers.
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0);
        }
    });
}

/// Every process's (pid, parent pid, is a zombie), from `/proc/<pid>/stat`.
fn processes() -> Vec<(i32, i32, bool)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses: read after the last ')'
        let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
        let state = rest.next()?;
        let ppid: i32 = rest.next()?.parse().ok()?;
        Some((pid, ppid, state == "Z" || state == "X"))
    })
    .collect()
}

/// Kill everything engine `leader` (tagged `tag`) started, wherever it went: every descendant of
/// `leader` (by parent pid, whatever its process group or session), every process re-parented to lockstep
/// that carries the tag (its parent died: [`become_subreaper`]) and their descendants, and any other
/// process carrying the tag. Repeated until a pass finds nothing alive (a process forking while it is
/// killed is caught by the next pass; at most 50 passes), and the orphans killed are reaped. `leader`
/// itself is killed but not reaped (its `Child` does that); call this before reaping it, while its pid
/// cannot have been reused.
fn sweep(leaders: &[i32], tag: &Tag) {
    #[cfg(unix)]
    {
        let me = std::process::id() as i32;
        for _ in 0..50 {
            let procs = processes();
            let mut children: std::collections::BTreeMap<i32, Vec<i32>> = Default::default();
            for &(pid, ppid, _) in &procs {
                children.entry(ppid).or_default().push(pid);
            }
            let mut todo: Vec<i32> = leaders.to_vec();
            todo.extend(
                procs
                    .iter()
                    .filter(|&&(pid, _, _)| pid != me && !leaders.contains(&pid))
                    .filter(|&&(pid, _, _)| tag.carried_by(pid))
                    .map(|&(pid, _, _)| pid),
            );
            let mut found = std::collections::BTreeSet::new();
            while let Some(p) = todo.pop() {
                if p != me && found.insert(p) {
                    todo.extend(children.get(&p).into_iter().flatten());
                }
            }
            let state: std::collections::BTreeMap<i32, (i32, bool)> = procs
                .iter()
                .map(|&(pid, ppid, z)| (pid, (ppid, z)))
                .collect();
            let mut alive = 0;
            for &p in &found {
                let Some(&(ppid, z)) = state.get(&p) else {
                    continue;
                };
                if !z {
                    alive += 1;
                    // SAFETY: kill(2) takes no pointers.
                    unsafe {
                        libc::kill(p, libc::SIGKILL);
                    }
                } else if ppid == me && !leaders.contains(&p) {
                    // an orphan re-parented to us, killed: reap it (never a leader, whose Child reaps it)
                    // SAFETY: a null status pointer is allowed.
                    unsafe {
                        libc::waitpid(p, std::ptr::null_mut(), libc::WNOHANG);
                    }
                }
            }
            if alive == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    #[cfg(not(unix))]
    let _ = (leaders, tag);
}

/// A scratch directory removed when dropped, and by the interrupt handler if the process is interrupted
/// first.
pub struct ScratchGuard {
    dir: tempfile::TempDir,
}

impl ScratchGuard {
    /// A new temporary directory (in `$TMPDIR`), registered for removal on interrupt.
    pub fn new(prefix: &str) -> Result<ScratchGuard> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .context("creating a scratch directory")?;
        lock(&SCRATCH).push(dir.path().to_path_buf());
        Ok(ScratchGuard { dir })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for ScratchGuard {
    fn drop(&mut self) {
        let p = self.dir.path().to_path_buf();
        lock(&SCRATCH).retain(|d| d != &p);
    }
}

/// What a bounded child left behind.
#[derive(Debug)]
pub struct Output {
    /// Exit status.
    pub status: ExitStatus,
    /// stdout, at most [`MAX_STDOUT_BYTES`].
    pub stdout: Vec<u8>,
    /// The last 64 KiB of stderr.
    pub stderr: Vec<u8>,
    /// The child's peak resident set, bytes: the largest `VmHWM` (the high-water mark of its resident
    /// set, file-backed pages of its memory maps included) read from `/proc/<pid>/status` while it ran —
    /// read at every poll, at most 50 ms apart, so a peak reached in its last moments before exit may be
    /// missed. Not `wait4`'s `ru_maxrss`: Linux carries the parent's resident set at `fork` into the
    /// child's `ru_maxrss` (`exec_mmap` keeps the old mm's high-water mark), so a child of a large
    /// harness would report the harness's size. `None` where no read succeeded (not Linux).
    pub peak_rss_bytes: Option<u64>,
}

/// Run `cmd` to completion within `timeout`, in its own process group, stdout and stderr captured in
/// files under `scratch`. `what` names the call in errors.
///
/// Errors: the command cannot be started; it outlives `timeout` (the whole group is killed; the error
/// names the command and the time); its stdout exceeds [`MAX_STDOUT_BYTES`].
pub fn run_bounded(
    mut cmd: Command,
    timeout: Duration,
    scratch: &Path,
    what: &str,
) -> Result<Output> {
    let shown = format!("{cmd:?}");
    let out_path = scratch.join(format!("{what}.stdout"));
    let err_path = scratch.join(format!("{what}.stderr"));
    let out_file =
        File::create(&out_path).with_context(|| format!("creating {}", out_path.display()))?;
    let err_file =
        File::create(&err_path).with_context(|| format!("creating {}", err_path.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(out_file))
        .stderr(Stdio::from(err_file));
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let tag = Tag::new();
    cmd.env(ENGINE_TAG_ENV, tag.value());
    become_subreaper();
    // spawn and register under one lock: an interrupt either comes first (nothing starts) or finds the
    // group registered and kills it
    let (mut child, pgid) = {
        let mut groups = lock(&LIVE_GROUPS);
        if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
            bail!("interrupted: the external engine ({what}) is not started");
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start the external engine ({what}): {shown}"))?;
        let pgid = child.id() as i32;
        groups.push(pgid);
        (child, pgid)
    };
    let start = Instant::now();
    let mut pause = Duration::from_millis(2);
    let mut peak_rss_bytes = vm_hwm(pgid);
    let status = loop {
        match exited_unreaped(pgid) {
            // the leader is a zombie until reaped, so its pid (= the group id) cannot be reused yet:
            // kill the helpers it left in its group first, then reap it
            Ok(true) => {
                end_engine(pgid, &tag);
                break child.wait().map_err(anyhow::Error::new);
            }
            Ok(false) if start.elapsed() >= timeout => {
                end_engine(pgid, &tag);
                let _ = child.wait();
                break Err(anyhow::anyhow!(
                    "the external engine ({what}) did not finish within {:.1} s; its process group was \
                     killed (raise the limit with --engine-timeout): {shown}",
                    timeout.as_secs_f64()
                ));
            }
            Ok(false) => {
                peak_rss_bytes = peak_rss_bytes.max(vm_hwm(pgid));
                let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
                if size(&out_path) > MAX_STDOUT_BYTES || size(&err_path) > MAX_STDERR_BYTES {
                    end_engine(pgid, &tag);
                    let _ = child.wait();
                    break Err(anyhow::anyhow!(
                        "the external engine ({what}) printed more than {MAX_STDOUT_BYTES} bytes to stdout \
                         or {MAX_STDERR_BYTES} to stderr; its process group was killed: {shown}"
                    ));
                }
                std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => {
                end_engine(pgid, &tag);
                let _ = child.wait();
                break Err(e.context(format!("waiting for {shown}")));
            }
        }
    };
    lock(&LIVE_GROUPS).retain(|&g| g != pgid);
    let status = status?;
    let mut stdout = Vec::new();
    File::open(&out_path)
        .and_then(|f| f.take(MAX_STDOUT_BYTES + 1).read_to_end(&mut stdout))
        .with_context(|| format!("reading {}", out_path.display()))?;
    if stdout.len() as u64 > MAX_STDOUT_BYTES {
        bail!("the external engine ({what}) printed more than {MAX_STDOUT_BYTES} bytes: {shown}");
    }
    let stderr = tail_of(&err_path, 64 * 1024).unwrap_or_default();
    Ok(Output {
        status,
        stdout,
        stderr,
        peak_rss_bytes,
    })
}

/// The `VmHWM` of process `pid` (`/proc/<pid>/status`, kB), in bytes; `None` when it cannot be read (the
/// process is gone or a zombie, or not Linux).
fn vm_hwm(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_hwm(&text)
}

/// `VmHWM:   123456 kB` of a `/proc/<pid>/status` text, in bytes.
fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut it = line["VmHWM:".len()..].split_whitespace();
    let kb: u64 = it.next()?.parse().ok()?;
    (it.next() == Some("kB")).then_some(kb * 1024)
}

/// Whether child `pid` has exited, without reaping it (`waitid(P_PID, pid, WEXITED | WNOHANG | WNOWAIT)`).
fn exited_unreaped(pid: i32) -> Result<bool> {
    #[cfg(unix)]
    {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter; waitid only writes into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if rc != 0 {
            return Err(anyhow::Error::new(std::io::Error::last_os_error()));
        }
        // SAFETY: filled by waitid; si_pid is 0 when no child has changed state.
        Ok(unsafe { info.si_pid() } != 0)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        Ok(true)
    }
}

fn tail_of(path: &Path, n: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Seek, SeekFrom};
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(n)))?;
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// Running (not gone, not a zombie awaiting its reaper).
    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
            let state = st.rsplit_once(')').map(|(_, r)| r.trim_start());
            !state.is_some_and(|r| r.starts_with('Z') || r.starts_with('X'))
        })
    }

    #[test]
    fn a_hung_command_and_its_helpers_are_killed_at_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        // the command starts a helper of its own, records both pids, and hangs
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("sleep 300 & echo $$ $! > {}; wait", pids.display()));
        let t0 = Instant::now();
        let e = format!(
            "{:#}",
            run_bounded(c, Duration::from_millis(700), dir.path(), "forward").unwrap_err()
        );
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert!(
            e.contains("did not finish within 0.7 s") && e.contains("sleep 300"),
            "{e}"
        );
        let text = std::fs::read_to_string(&pids).unwrap();
        let ids: Vec<i32> = text
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        for pid in ids {
            assert!(!alive(pid), "process {pid} outlived its killed group");
        }
    }

    #[test]
    fn a_child_flooding_its_output_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let e = format!(
            "{:#}",
            run_bounded(
                Command::new("yes"),
                Duration::from_secs(120),
                dir.path(),
                "tokenize"
            )
            .unwrap_err()
        );
        assert!(e.contains("printed more than") && e.contains("yes"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(60));
        let out = std::fs::metadata(dir.path().join("tokenize.stdout"))
            .unwrap()
            .len();
        // bounded by the cap plus what `yes` writes between two polls (≤ 50 ms), not by the timeout
        assert!(out < 1 << 30, "{out} bytes written");
    }

    #[test]
    fn output_and_status_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Command::new("sh");
        c.arg("-c").arg("echo 1,2,3; echo oops >&2; exit 3");
        let o = run_bounded(c, Duration::from_secs(30), dir.path(), "tokenize").unwrap();
        assert_eq!(o.stdout, b"1,2,3\n");
        assert_eq!(o.stderr, b"oops\n");
        assert_eq!(o.status.code(), Some(3));
    }

    #[test]
    fn the_peak_rss_of_a_child_is_read_while_it_runs() {
        let dir = tempfile::tempdir().unwrap();
        // dd reads into one 64 MiB buffer, 40 times (long enough to be polled): its peak RSS is at
        // least that
        let mut c = Command::new("dd");
        c.args(["if=/dev/zero", "of=/dev/null", "bs=64M", "count=40"]);
        let o = run_bounded(c, Duration::from_secs(60), dir.path(), "dd").unwrap();
        assert!(o.status.success());
        let rss = o
            .peak_rss_bytes
            .expect("/proc/<pid>/status has VmHWM on Linux");
        assert!(
            rss >= 64 << 20,
            "peak RSS {rss} below the 64 MiB buffer dd filled"
        );
        // a small child is far below it, whatever this test process's own size (nothing inherited)
        let big: Vec<u8> = vec![1u8; 256 << 20];
        let mut c = Command::new("sleep");
        c.arg("0.2");
        let o = run_bounded(c, Duration::from_secs(30), dir.path(), "sleep").unwrap();
        let small = o.peak_rss_bytes.unwrap();
        assert!(small < 32 << 20, "sleep's peak RSS {small}");
        std::hint::black_box(&big);
        assert_eq!(
            parse_vm_hwm("Name:\tx\nVmPeak:\t  900 kB\nVmHWM:\t   1234 kB\nVmRSS:\t 1 kB\n"),
            Some(1234 * 1024)
        );
        assert_eq!(parse_vm_hwm("Name:\tzombie\n"), None);
    }

    #[test]
    fn scratch_directories_are_registered_until_dropped() {
        let g = ScratchGuard::new("lockstep-test-").unwrap();
        let p = g.path().to_path_buf();
        assert!(lock(&SCRATCH).contains(&p));
        drop(g);
        assert!(!p.exists() && !lock(&SCRATCH).contains(&p));
    }
}

impl ScratchGuard {
    /// A new temporary directory named `<prefix>XXXXXX` inside `dir` (which must exist), registered for
    /// removal on interrupt like [`ScratchGuard::new`]: for scratch files too large for `$TMPDIR`, or
    /// that must be renamed into `dir` (same file system). Added for `lockstep quality` (its base-logits
    /// cache and llama-perplexity's base log-probs, each up to a few GB).
    ///
    /// Errors: the directory cannot be created (named).
    pub fn new_in(dir: &Path, prefix: &str) -> Result<ScratchGuard> {
        let d = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(dir)
            .with_context(|| format!("creating a scratch directory in {}", dir.display()))?;
        lock(&SCRATCH).push(d.path().to_path_buf());
        Ok(ScratchGuard { dir: d })
    }
}

/// Longest line a [`LineChild`] may print on stdout (a protocol reply names a file; 1 MiB is generous).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// A long-lived child that answers requests line by line on its stdin/stdout (the engine session
/// protocol, [`crate::protocol`]), bounded as [`run_bounded`] bounds a one-shot command: its own process
/// group, registered for the interrupt handler; stderr to a file, the group killed when it exceeds
/// [`MAX_STDERR_BYTES`]; every reply awaited at most a timeout, after which the group is killed; a reply
/// line longer than [`MAX_LINE_BYTES`] is an error; dropped, the child's stdin is closed and its group
/// killed and reaped.
pub struct LineChild {
    child: std::process::Child,
    pgid: i32,
    tag: Tag,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<std::result::Result<String, String>>,
    err_path: PathBuf,
    shown: String,
    dead: Option<String>,
}

impl LineChild {
    /// Start `cmd` with piped stdin/stdout, stderr to `<scratch>/<what>.stderr`. `what` names it in errors.
    ///
    /// Errors: the command cannot be started, or an interrupt already arrived.
    pub fn spawn(mut cmd: Command, scratch: &Path, what: &str) -> Result<LineChild> {
        let shown = format!("{cmd:?}");
        let err_path = scratch.join(format!("{what}.stderr"));
        let err_file =
            File::create(&err_path).with_context(|| format!("creating {}", err_path.display()))?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err_file));
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let tag = Tag::new();
        cmd.env(ENGINE_TAG_ENV, tag.value());
        become_subreaper();
        let (mut child, pgid) = {
            let mut groups = lock(&LIVE_GROUPS);
            if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
                bail!("interrupted: the external engine ({what}) is not started");
            }
            let child = cmd
                .spawn()
                .with_context(|| format!("cannot start the external engine ({what}): {shown}"))?;
            let pgid = child.id() as i32;
            groups.push(pgid);
            (child, pgid)
        };
        let stdout = child.stdout.take().context("the child's stdout")?;
        let stdin = child.stdin.take();
        // a small channel: an engine that floods stdout blocks on its pipe instead of filling memory
        let (tx, rx) = std::sync::mpsc::sync_channel(2);
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut r = std::io::BufReader::new(stdout);
            loop {
                let mut buf = Vec::new();
                let read = (&mut r)
                    .take(MAX_LINE_BYTES as u64 + 1)
                    .read_until(b'\n', &mut buf);
                let msg = match read {
                    Ok(0) => Err("closed its stdout (exited?)".to_string()),
                    Ok(_) if buf.last() != Some(&b'\n') && buf.len() > MAX_LINE_BYTES => Err(
                        format!("printed a line longer than {MAX_LINE_BYTES} bytes on stdout"),
                    ),
                    Ok(_) => String::from_utf8(buf)
                        .map(|s| s.trim_end_matches(['\n', '\r']).to_string())
                        .map_err(|_| "printed a line that is not UTF-8 on stdout".to_string()),
                    Err(e) => Err(format!("reading its stdout: {e}")),
                };
                let stop = msg.is_err();
                if tx.send(msg).is_err() || stop {
                    return;
                }
            }
        });
        Ok(LineChild {
            child,
            pgid,
            tag,
            stdin,
            lines: rx,
            err_path,
            shown,
            dead: None,
        })
    }

    /// The command as started (for errors and reports).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The last `n` bytes the child wrote to stderr, as text.
    pub fn stderr_tail(&self, n: u64) -> String {
        String::from_utf8_lossy(&tail_of(&self.err_path, n).unwrap_or_default()).into_owned()
    }

    /// Send one line (a newline is appended) and wait at most `timeout` for the one-line answer.
    ///
    /// Errors (the child is killed and every later call fails): it cannot be written to; it exits or closes
    /// stdout; it does not answer within `timeout`; it writes more than [`MAX_STDERR_BYTES`] to stderr; its
    /// answer is longer than [`MAX_LINE_BYTES`] or not UTF-8. Each names the command, with the tail of its
    /// stderr.
    pub fn request(&mut self, line: &str, timeout: Duration) -> Result<String> {
        if let Some(why) = &self.dead {
            bail!(
                "the external engine is no longer running ({why}): {}",
                self.shown
            );
        }
        let sent = match self.stdin.as_mut() {
            Some(w) => {
                use std::io::Write;
                w.write_all(line.as_bytes())
                    .and_then(|()| w.write_all(b"\n"))
                    .and_then(|()| w.flush())
            }
            None => Err(std::io::Error::other("stdin closed")),
        };
        if let Err(e) = sent {
            return Err(self.fail(format!("it cannot be written to ({e})")));
        }
        let start = Instant::now();
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            match self.lines.recv_timeout(left.min(Duration::from_millis(50))) {
                Ok(Ok(l)) => return Ok(l),
                Ok(Err(why)) => return Err(self.fail(format!("it {why}"))),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(self.fail("it closed its stdout".into()))
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            if std::fs::metadata(&self.err_path).map_or(0, |m| m.len()) > MAX_STDERR_BYTES {
                return Err(self.fail(format!(
                    "it wrote more than {MAX_STDERR_BYTES} bytes to stderr; its process group was killed"
                )));
            }
            if start.elapsed() >= timeout {
                return Err(self.fail(format!(
                    "it did not answer within {:.1} s; its process group was killed (raise the limit with \
                     --engine-timeout)",
                    timeout.as_secs_f64()
                )));
            }
        }
    }

    /// Kill the group, remember why, and build the error (with the exit status and stderr's tail).
    fn fail(&mut self, why: String) -> anyhow::Error {
        self.stop();
        let status = self
            .child
            .try_wait()
            .ok()
            .flatten()
            .map_or(String::new(), |s| format!(" ({s})"));
        let tail = self.stderr_tail(4096);
        let tail: Vec<&str> = tail.lines().rev().take(10).collect();
        let e = anyhow::anyhow!(
            "the external engine failed{status}: {why}: {}\n{}",
            self.shown,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
        self.dead = Some(why);
        e
    }

    fn stop(&mut self) {
        self.stdin = None;
        if self.dead.is_none() {
            end_engine(self.pgid, &self.tag);
            let _ = self.child.wait();
            lock(&LIVE_GROUPS).retain(|&g| g != self.pgid);
            self.dead = Some("stopped".into());
        }
    }
}

impl Drop for LineChild {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(all(test, unix))]
mod line_child_tests {
    use super::*;

    #[test]
    fn a_line_child_answers_and_a_silent_one_is_killed_at_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        // answers the first line, then hangs with a helper of its own
        let pids = dir.path().join("pids");
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!(
            "read l; echo \"got $l\"; sleep 300 & echo $$ $! > {}; wait",
            pids.display()
        ));
        let mut ch = LineChild::spawn(c, dir.path(), "serve").unwrap();
        assert_eq!(
            ch.request("hello", Duration::from_secs(30)).unwrap(),
            "got hello"
        );
        let t0 = Instant::now();
        let e = format!(
            "{:#}",
            ch.request("again", Duration::from_millis(500)).unwrap_err()
        );
        assert!(e.contains("did not answer within 0.5 s"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(100));
        let text = std::fs::read_to_string(&pids).unwrap();
        for pid in text.split_whitespace() {
            assert!(
                !std::path::Path::new(&format!("/proc/{pid}/cmdline")).exists()
                    || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                        .is_ok_and(|s| s.contains(") Z")),
                "process {pid} outlived its killed group"
            );
        }
        let e = format!(
            "{:#}",
            ch.request("more", Duration::from_secs(1)).unwrap_err()
        );
        assert!(e.contains("no longer running"), "{e}");
    }

    #[test]
    fn a_child_that_exits_is_an_error_with_its_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg("read l; echo 'model not found' >&2; exit 3");
        let mut ch = LineChild::spawn(c, dir.path(), "serve").unwrap();
        let e = format!(
            "{:#}",
            ch.request("load", Duration::from_secs(30)).unwrap_err()
        );
        assert!(
            e.contains("closed its stdout") && e.contains("model not found"),
            "{e}"
        );
    }

    #[test]
    fn an_overlong_line_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg("read l; head -c 3000000 /dev/zero | tr '\\0' x; echo");
        let mut ch = LineChild::spawn(c, dir.path(), "serve").unwrap();
        let e = format!(
            "{:#}",
            ch.request("x", Duration::from_secs(30)).unwrap_err()
        );
        assert!(e.contains("longer than"), "{e}");
    }
}
