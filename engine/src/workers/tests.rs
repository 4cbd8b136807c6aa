//! The persistent pool: every task once, for any worker count and task count; panics reach the caller;
//! nested and concurrent callers are served (on rayon) rather than blocked.

use super::*;
use std::sync::atomic::AtomicUsize;

/// Runs `pool.for_each(n)` and requires every index exactly once.
fn each_once(pool: &Pool, n: usize) {
    let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
    pool.for_each(n, &|i| {
        counts[i].fetch_add(1, Ordering::Relaxed);
    });
    for (i, c) in counts.iter().enumerate() {
        assert_eq!(
            c.load(Ordering::Relaxed),
            1,
            "{} workers, {n} tasks: task {i}",
            pool.n_workers()
        );
    }
}

/// The message of a caught panic.
fn message(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn every_task_runs_exactly_once_for_any_worker_and_task_count() {
    for workers in [0, 1, 2, 3, 4, 8] {
        let pool = Pool::new(workers);
        assert_eq!(pool.n_workers(), workers.max(1));
        for n in [0, 1, 2, 3, 7, 8, 63, 64, 65, 1000] {
            // many ops back to back: the barrier between them is what is under test
            for _ in 0..50 {
                each_once(&pool, n);
            }
        }
    }
}

#[test]
fn no_task_means_no_call() {
    let pool = Pool::new(2);
    pool.for_each(0, &|i| panic!("task {i} of none"));
    for_each(0, &|i| panic!("task {i} of none"));
    let mut empty: [u8; 0] = [];
    for_each_chunk_mut(&mut empty, 4, |c, _| panic!("chunk {c} of none"));
}

#[test]
fn tasks_run_on_more_than_one_thread_and_one_worker_runs_none() {
    // long tasks: the pool's thread must take some of them
    let pool = Pool::new(2);
    let caller = std::thread::current().id();
    let elsewhere = AtomicUsize::new(0);
    pool.for_each(200, &|_| {
        std::thread::sleep(Duration::from_micros(200));
        if std::thread::current().id() != caller {
            elsewhere.fetch_add(1, Ordering::Relaxed);
        }
    });
    assert!(
        elsewhere.load(Ordering::Relaxed) > 0,
        "the worker ran no task"
    );
    let one = Pool::new(1);
    one.for_each(50, &|_| assert_eq!(std::thread::current().id(), caller));
}

#[test]
fn a_panic_in_a_task_reaches_the_caller_and_the_pool_keeps_working() {
    for workers in [1, 2, 4] {
        let pool = Pool::new(workers);
        // one task of many panics, on whichever worker claims it
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.for_each(1000, &|i| assert!(i != 517, "task {i} failed"));
        }));
        let p = r.expect_err("the panic must reach the caller");
        assert!(message(&*p).contains("task 517 failed"), "{}", message(&*p));
        each_once(&pool, 100);
    }
    // a panic on a pool thread (not the caller's) is carried back
    let pool = Pool::new(2);
    let caller = std::thread::current().id();
    let r = catch_unwind(AssertUnwindSafe(|| {
        pool.for_each(500, &|_| {
            std::thread::sleep(Duration::from_micros(200));
            assert_eq!(std::thread::current().id(), caller, "ran on a pool thread");
        });
    }));
    let p = r.expect_err("the worker's panic must reach the caller");
    assert!(
        message(&*p).contains("ran on a pool thread"),
        "{}",
        message(&*p)
    );
    each_once(&pool, 100);
}

#[test]
fn a_nested_call_runs_rather_than_waits() {
    let pool = Pool::new(2);
    let counts: Vec<AtomicUsize> = (0..8 * 16).map(|_| AtomicUsize::new(0)).collect();
    pool.for_each(8, &|i| {
        // the pool is held by the outer call: this one takes rayon
        pool.for_each(16, &|j| {
            counts[i * 16 + j].fetch_add(1, Ordering::Relaxed);
        });
    });
    assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
}

#[test]
fn concurrent_callers_each_get_every_task_once() {
    let pool = Pool::new(2);
    std::thread::scope(|s| {
        for t in 0..4 {
            let pool = &pool;
            s.spawn(move || {
                for k in 0..300 {
                    each_once(pool, 1 + (t * 7 + k) % 97);
                }
            });
        }
    });
    // the engine's pools, shared by every caller of `for_each`
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                for k in 0..300 {
                    let n = 1 + (t * 5 + k) % 61;
                    let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                    for_each(n, &|i| {
                        counts[i].fetch_add(1, Ordering::Relaxed);
                    });
                    assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
                }
            });
        }
    });
}

#[test]
fn the_engine_pool_follows_the_rayon_thread_count() {
    for threads in [1, 2, 3] {
        let rp = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        rp.install(|| {
            let caller = std::thread::current().id();
            let counts: Vec<AtomicUsize> = (0..333).map(|_| AtomicUsize::new(0)).collect();
            for_each(counts.len(), &|i| {
                if threads == 1 {
                    assert_eq!(std::thread::current().id(), caller, "one worker: no thread");
                }
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        });
        if threads > 1 {
            assert_eq!(pool_of(threads).map(Pool::n_workers), Some(threads));
        }
    }
}

#[test]
fn chunks_cover_the_slice_once_with_a_short_last_one() {
    for (len, chunk) in [(0, 3), (1, 3), (10, 3), (12, 3), (1000, 64), (5, 100)] {
        let mut data = vec![0usize; len];
        for_each_chunk_mut(&mut data, chunk, |c, part| {
            assert!(part.len() == chunk || (c + 1) * chunk >= len, "chunk {c}");
            for (j, v) in part.iter_mut().enumerate() {
                *v += c * chunk + j + 1;
            }
        });
        let want: Vec<usize> = (1..=len).collect();
        assert_eq!(data, want, "{len} elements in chunks of {chunk}");
    }
}

#[test]
fn chunk_pairs_match_chunk_for_chunk() {
    for (n, wa, wb) in [(0, 3, 2), (1, 3, 2), (17, 3, 2), (64, 5, 1)] {
        let (mut a, mut b) = (vec![0usize; n * wa], vec![0usize; n * wb]);
        for_each_chunk_pair_mut(&mut a, 4 * wa, &mut b, 4 * wb, |c, pa, pb| {
            assert_eq!(pa.len() / wa, pb.len() / wb, "chunk {c}");
            pa.iter_mut().for_each(|v| *v += c + 1);
            pb.iter_mut().for_each(|v| *v += c + 1);
        });
        let want = |w: usize| -> Vec<usize> { (0..n * w).map(|i| i / (4 * w) + 1).collect() };
        assert_eq!(a, want(wa), "{n} rows");
        assert_eq!(b, want(wb), "{n} rows");
    }
}
