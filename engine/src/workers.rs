//! Persistent worker threads that meet at a spin barrier: the engine's hot parallel loops (a matmul's
//! row chunks, attention's runs of heads, a batch's row-wise ops) run as the tasks of one pool whose
//! threads stay awake between the ops of a forward step, instead of a rayon fork/join per op.
//!
//! After ggml's CPU threadpool (`ggml/src/ggml-cpu/ggml-cpu.c`: `struct ggml_threadpool`,
//! `ggml_graph_compute_thread`, `ggml_graph_compute_poll_for_work`, `ggml_barrier`): the calling thread
//! is worker 0 and takes part in every op; the other workers poll for the next op for a bounded time
//! ([`SPIN`]) and then sleep on a condition variable until an op wakes them
//! (`ggml_graph_compute_check_for_work`'s `cond_wait`). The op's tasks are claimed through an atomic
//! counter, as ggml's `mul_mat` claims its chunks (`threadpool->current_chunk`), and a task computes a
//! fixed set of outputs, so no result depends on which worker ran it or on how many there are.
//!
//! Two differences from ggml, for an engine that is also called from tests and from several threads:
//! the caller returns as soon as every task is done and the workers that joined the op have left it (a
//! worker still asleep is not waited for: the op is closed to it), and a call that finds the pool in
//! use — a nested call from inside a task, or another thread's forward — runs on rayon instead, as the
//! engine did before, so it never blocks on the pool.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rayon::prelude::*;

/// How long an idle worker polls for the next op before it sleeps on the condition variable, and how
/// long the caller polls for the workers of an op before it yields its core between polls. A forward
/// step's ops follow one another within microseconds, so a worker that polls this long catches the
/// next op without a wake-up; an idle engine (a test waiting on another, a server between requests)
/// stops burning its cores after this long. ggml polls a count of rounds instead
/// (`GGML_THREADPOOL_POLL`, `ggml_graph_compute_poll_for_work`); a time bound is the same on every CPU.
pub const SPIN: Duration = Duration::from_micros(100);

/// Most workers a pool of [`for_each`] has (a larger rayon pool runs the tasks on rayon).
const MAX_WORKERS: usize = 64;

/// The `active` bit that closes an op to workers that have not joined it yet.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// The op the workers run: `f(i)` for every `i < n_tasks`.
#[derive(Clone, Copy)]
struct Job {
    /// The caller's closure with its lifetime erased: valid until the caller has seen every worker
    /// that joined the op leave it ([`Pool::for_each`] waits for that before it returns).
    f: *const (dyn Fn(usize) + Sync + 'static),
    n_tasks: usize,
}

/// The state the caller and the workers share.
struct Shared {
    /// The current op; written by the caller only while no worker is inside an op (`active` ==
    /// [`CLOSED`]), read by a worker only after it joined the op.
    job: UnsafeCell<Job>,
    /// The next task index to claim.
    next: AtomicUsize,
    /// The workers inside the current op, with the [`CLOSED`] bit once the caller has closed it.
    active: AtomicUsize,
    /// Bumped for every op (and at shutdown): what an idle worker polls.
    generation: AtomicU64,
    /// Workers asleep on `wake` (the caller takes the lock and notifies only when there are some).
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// The first panic of a task on a worker, re-raised by the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Set when the pool is dropped: the workers exit.
    shutdown: AtomicBool,
}

// SAFETY: `job` is written only by the one caller that holds the pool (`Pool::busy`) while no worker is
// inside an op, and read by workers only between joining and leaving an op, ordered by `active`
// (Release when opened, Acquire when joined); the closure it points to is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A pool of `n` workers: the caller of [`Pool::for_each`] and `n - 1` threads of its own, which live
/// as long as the pool.
pub struct Pool {
    shared: Arc<Shared>,
    n_workers: usize,
    /// Held by the caller of a running op.
    busy: AtomicBool,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool of `n_workers` workers (`n_workers - 1` threads; 0 and 1 both mean no thread: every op
    /// runs on its caller).
    ///
    /// Panics if a thread cannot be spawned (as `std::thread::spawn`).
    pub fn new(n_workers: usize) -> Pool {
        let n_workers = n_workers.max(1);
        let nothing: &'static (dyn Fn(usize) + Sync) = &|_: usize| {};
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(Job {
                f: nothing,
                n_tasks: 0,
            }),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(CLOSED),
            generation: AtomicU64::new(0),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            panic: Mutex::new(None),
            shutdown: AtomicBool::new(false),
        });
        let threads = (1..n_workers)
            .map(|i| {
                let sh = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("lockstep-worker-{i}"))
                    .spawn(move || worker(&sh))
                    .expect("cannot spawn an engine worker thread")
            })
            .collect();
        Pool {
            shared,
            n_workers,
            busy: AtomicBool::new(false),
            threads,
        }
    }

    /// Workers of this pool, the caller included.
    pub fn n_workers(&self) -> usize {
        self.n_workers
    }

    /// `f(i)` for every `i < n_tasks`, each exactly once, on this pool's workers (the caller is one of
    /// them); returns when all are done. Tasks are claimed through one atomic counter, so which worker
    /// runs a task varies from call to call: `f` must write disjoint outputs per task.
    ///
    /// No threads for `n_tasks` ≤ 1 or a one-worker pool; a call that finds the pool in use (nested
    /// inside a task, or from another thread meanwhile) runs the tasks on rayon instead. A panic in a
    /// task is re-raised here once every worker has left the op (the other tasks may or may not have
    /// run).
    pub fn for_each(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks <= 1 || self.n_workers == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            (0..n_tasks).into_par_iter().for_each(f);
            return;
        }
        let sh = &*self.shared;
        // SAFETY: only the lifetime is erased; the pointer is dereferenced by workers only inside this
        // op, and this call returns (or unwinds) only after every worker that joined the op left it.
        let erased = unsafe {
            std::mem::transmute::<
                *const (dyn Fn(usize) + Sync + '_),
                *const (dyn Fn(usize) + Sync + 'static),
            >(f)
        };
        // SAFETY: we hold `busy`, and `active` is CLOSED with no worker inside (the previous caller
        // waited for that), so no one reads `job` now.
        unsafe { *sh.job.get() = Job { f: erased, n_tasks } };
        sh.next.store(0, Ordering::Relaxed);
        // open the op (Release: a worker that joins sees the job and the counter), then announce it
        sh.active.store(0, Ordering::Release);
        sh.generation.fetch_add(1, Ordering::SeqCst);
        if sh.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = sh.lock.lock().unwrap_or_else(PoisonError::into_inner);
            sh.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| run_tasks(sh, f, n_tasks)));
        // the barrier: close the op to workers that have not joined it, wait for those inside
        sh.active.fetch_or(CLOSED, Ordering::AcqRel);
        let start = Instant::now();
        let mut polls = 0u32;
        while sh.active.load(Ordering::Acquire) != CLOSED {
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(64) && start.elapsed() > SPIN {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let theirs = sh
            .panic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.busy.store(false, Ordering::Release);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if let Some(p) = theirs {
            resume_unwind(p);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::SeqCst);
        sh.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _g = sh.lock.lock().unwrap_or_else(PoisonError::into_inner);
            sh.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Claims and runs tasks of the current op until none is left.
fn run_tasks(sh: &Shared, f: &(dyn Fn(usize) + Sync), n_tasks: usize) {
    loop {
        let i = sh.next.fetch_add(1, Ordering::Relaxed);
        if i >= n_tasks {
            return;
        }
        f(i);
    }
}

/// A pool thread: poll for an op ([`SPIN`]), else sleep until one is announced; join it unless it is
/// already closed, run its tasks, leave it.
fn worker(sh: &Shared) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            let g = sh.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(64) && start.elapsed() > SPIN {
                let mut guard = sh.lock.lock().unwrap_or_else(PoisonError::into_inner);
                sh.sleeping.fetch_add(1, Ordering::SeqCst);
                while sh.generation.load(Ordering::SeqCst) == seen {
                    guard = sh.wake.wait(guard).unwrap_or_else(PoisonError::into_inner);
                }
                sh.sleeping.fetch_sub(1, Ordering::SeqCst);
            } else {
                std::hint::spin_loop();
            }
        }
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        let joined = sh
            .active
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |a| {
                ((a & CLOSED) == 0).then_some(a + 1)
            })
            .is_ok();
        if !joined {
            continue; // the op was over before this worker got to it
        }
        // SAFETY: joined an open op: the caller wrote `job` before opening it (Release on `active`,
        // Acquire above) and keeps the closure alive until this worker leaves
        let job = unsafe { *sh.job.get() };
        let f = unsafe { &*job.f };
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| run_tasks(sh, f, job.n_tasks))) {
            let mut slot = sh.panic.lock().unwrap_or_else(PoisonError::into_inner);
            slot.get_or_insert(p);
        }
        sh.active.fetch_sub(1, Ordering::Release);
    }
}

/// The pool for `n` workers, made on first use and kept for the process; `None` for one worker or more
/// than [`MAX_WORKERS`].
fn pool_of(n: usize) -> Option<&'static Pool> {
    static POOLS: [OnceLock<Pool>; MAX_WORKERS + 1] = [const { OnceLock::new() }; MAX_WORKERS + 1];
    if n <= 1 {
        return None;
    }
    POOLS.get(n).map(|p| p.get_or_init(|| Pool::new(n)))
}

/// The engine's worker count: the current rayon pool's thread count (`lockstep --threads N` builds the
/// global pool; a test installs its own), which sizes the pool [`for_each`] runs on and the split of a
/// matmul's rows.
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// `f(i)` for every `i < n_tasks`, each exactly once, on the engine's persistent workers
/// ([`Pool::for_each`]); returns when all are done. The worker count is the engine's thread count: the
/// current rayon pool's (`lockstep --threads N` builds the global one; a test installs its own), one
/// meaning no threads at all, more than [`MAX_WORKERS`] the rayon pool itself.
pub fn for_each(n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    let n = threads();
    match pool_of(n) {
        Some(pool) => pool.for_each(n_tasks, f),
        None if n <= 1 => (0..n_tasks).for_each(f),
        None => (0..n_tasks).into_par_iter().for_each(f),
    }
}

/// `f(c, chunk)` for every `chunk`-element chunk of `data` (`c` its index; the last may be shorter),
/// through [`for_each`]: rayon's `par_chunks_mut(chunk).enumerate().for_each(..)` on the persistent
/// workers. Panics if `chunk` is 0.
pub fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    assert!(chunk > 0, "chunk size 0");
    let len = data.len();
    let base = SendPtr(data.as_mut_ptr());
    for_each(len.div_ceil(chunk), &|c| {
        let start = c * chunk;
        // SAFETY: the chunks are disjoint and in bounds, each task takes its own, and `data` is
        // borrowed mutably until every task has returned
        let part = unsafe {
            std::slice::from_raw_parts_mut(base.get().add(start), chunk.min(len - start))
        };
        f(c, part)
    });
}

/// [`for_each_chunk_mut`] over two slices at once: `f(c, a_c, b_c)` with chunk `c` of `a` (`chunk_a`
/// elements) and of `b` (`chunk_b`) — a batch's Q and K rows, say. Panics if a chunk size is 0 or the two
/// slices have different chunk counts.
pub fn for_each_chunk_pair_mut<A: Send, B: Send>(
    a: &mut [A],
    chunk_a: usize,
    b: &mut [B],
    chunk_b: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
) {
    assert!(chunk_a > 0 && chunk_b > 0, "chunk size 0");
    let len_b = b.len();
    assert_eq!(
        a.len().div_ceil(chunk_a),
        len_b.div_ceil(chunk_b),
        "chunk counts of the two slices"
    );
    let base_b = SendPtr(b.as_mut_ptr());
    for_each_chunk_mut(a, chunk_a, |c, part_a| {
        let start = c * chunk_b;
        // SAFETY: as in `for_each_chunk_mut`: chunk c of `b` is in bounds (same chunk count), disjoint
        // from the others and taken by task c alone, and `b` is borrowed mutably until all return
        let part_b = unsafe {
            std::slice::from_raw_parts_mut(base_b.get().add(start), chunk_b.min(len_b - start))
        };
        f(c, part_a, part_b)
    });
}

/// A slice's base pointer shared by tasks that each take a disjoint part of it.
struct SendPtr<T>(*mut T);
// SAFETY: the tasks that share it touch disjoint elements (`for_each_chunk_mut`), and `T: Send`.
unsafe impl<T: Send> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    /// The pointer (a method, so that closures capture the whole `Sync` wrapper).
    fn get(&self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests;
