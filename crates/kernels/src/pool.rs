//! A persistent worker pool for data-parallel kernels.
//!
//! `run(n, f)` calls `f(0..n)` across the caller and the workers and returns when all calls
//! are done. Workers spin briefly on the job counter, then park on a condition variable, so
//! back-to-back kernel calls (the decode pattern) avoid both thread spawns and wake-up
//! latency. Tasks are claimed from an atomic counter; which thread runs a task never changes
//! its result (callers split output columns or rows, never a reduction).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spin iterations before a waiting thread parks (about 10-50 µs on current x86 cores).
const SPIN_LIMIT: u32 = 20_000;

type Task<'a> = &'a (dyn Fn(usize) + Sync);

/// Work a parallel region does before its tasks, in the same region: `tasks` calls of
/// `run(i)`, every one finished before any task starts (a matmul's activation rows quantized
/// before its column parts read them). One region instead of two saves a job's posting, the
/// wait at its end and the serial gap between.
#[derive(Clone, Copy)]
pub struct Prelude<'a> {
    pub tasks: usize,
    pub run: Task<'a>,
}

impl Prelude<'_> {
    pub const NONE: Prelude<'static> = Prelude {
        tasks: 0,
        run: &nop,
    };
}

struct Job {
    task: *const (dyn Fn(usize) + Sync),
    n: usize,
}

struct Shared {
    /// Bumped once per posted job; workers run each epoch exactly once.
    epoch: AtomicU64,
    job: UnsafeCell<Job>,
    next: AtomicUsize,
    /// Workers that have not finished the current epoch.
    active: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Workers parked (or about to park) on `wake`, and whether the caller is parked on
    /// `done`: a thread only takes the lock and makes the wake-up system call when someone
    /// sleeps, so back-to-back jobs between spinning threads cost no system call. The
    /// counters and the state they guard are `SeqCst`: a sleeper announces itself, then
    /// re-reads the state; a waker changes the state, then reads the announcement; so at
    /// least one of the two sees the other.
    sleepers: AtomicUsize,
    caller_parked: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    done: Condvar,
}

// SAFETY: `job` is written only by `run` while no worker is active (all finished the previous
// epoch), and read by workers only between the epoch bump and their `active` decrement,
// during which `run` is blocked waiting; the task it points to outlives that window.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

fn nop(_: usize) {}

/// A fixed set of worker threads plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes `run` calls from different threads sharing one pool.
    running: Mutex<()>,
}

impl ThreadPool {
    /// A pool that uses `threads` threads in all (the caller counts as one), or as many as
    /// the system lets it start ([`ThreadPool::threads`] says how many it got).
    pub fn new(threads: usize) -> ThreadPool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                task: &nop as &(dyn Fn(usize) + Sync),
                n: 0,
            }),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            caller_parked: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            done: Condvar::new(),
        });
        // A spawn the system refuses (EAGAIN: a thread limit) ends the pool there, with
        // the workers it got.
        let workers = (1..threads)
            .map_while(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("oxgen-worker-{i}"))
                    .spawn(move || worker(&shared))
                    .ok()
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            running: Mutex::new(()),
        }
    }

    /// Threads that run tasks, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `task(i)` for every `i` in `0..n`, in parallel, and waits for all of them.
    pub fn run(&self, n: usize, task: Task<'_>) {
        if self.workers.is_empty() || n <= 1 {
            (0..n).for_each(task);
            return;
        }
        let _running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: no worker is active (the previous run waited for all of them), so nothing
        // reads `job` now; the lifetime is erased because this call waits for every worker to
        // finish with the task before returning.
        unsafe {
            let task: *const (dyn Fn(usize) + Sync + '_) = task;
            *s.job.get() = Job {
                task: std::mem::transmute::<
                    *const (dyn Fn(usize) + Sync + '_),
                    *const (dyn Fn(usize) + Sync),
                >(task),
                n,
            };
        }
        s.next.store(0, Ordering::Relaxed);
        s.active.store(self.workers.len(), Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            // A parked worker announced itself under the lock and holds it until it waits,
            // so taking the lock here means it is waiting and hears this.
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let caller = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, task, n)));
        let mut spins = 0;
        while s.active.load(Ordering::Acquire) != 0 {
            if spins < SPIN_LIMIT {
                spins += 1;
                std::hint::spin_loop();
            } else {
                let g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.caller_parked.store(true, Ordering::SeqCst);
                if s.active.load(Ordering::SeqCst) != 0 {
                    drop(s.done.wait(g).unwrap_or_else(|e| e.into_inner()));
                }
                s.caller_parked.store(false, Ordering::SeqCst);
            }
        }
        if let Err(p) = caller {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a thread-pool task panicked (see the message above)");
        }
    }

    /// Runs `prelude`'s calls, then `task(i)` for every `i` in `0..n`, in one parallel region
    /// (on the calling thread alone when there are no workers or at most one task).
    /// Tasks are claimed in order, so a thread that claims a task knows every prelude call
    /// has been claimed; it waits for them all to finish (a prelude call never waits, so they
    /// do). A panicking prelude call still counts as finished: the tasks run and the panic
    /// reaches the caller, as from [`ThreadPool::run`].
    pub fn run_after(&self, prelude: Prelude<'_>, n: usize, task: Task<'_>) {
        if prelude.tasks == 0 || n <= 1 || self.workers.is_empty() {
            // Nothing to overlap: the prelude on this thread, then the task(s).
            (0..prelude.tasks).for_each(prelude.run);
            return self.run(n, task);
        }
        struct Finished<'a>(&'a AtomicUsize);
        impl Drop for Finished<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Release);
            }
        }
        let finished = AtomicUsize::new(0);
        self.run(prelude.tasks + n, &|i| {
            if i < prelude.tasks {
                let _counts = Finished(&finished);
                (prelude.run)(i);
                return;
            }
            while finished.load(Ordering::Acquire) < prelude.tasks {
                std::hint::spin_loop();
            }
            task(i - prelude.tasks);
        });
    }
}

fn claim(s: &Shared, task: Task<'_>, n: usize) {
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        task(i);
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0;
        loop {
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            if s.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            if spins < SPIN_LIMIT {
                spins += 1;
                std::hint::spin_loop();
            } else {
                let g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                if s.epoch.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst) {
                    drop(s.wake.wait(g).unwrap_or_else(|e| e.into_inner()));
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
        }
        seen = s.epoch.load(Ordering::Acquire);
        // SAFETY: see `Shared`: the job stays valid until this worker decrements `active`.
        let (task, n) = unsafe {
            let job = &*s.job.get();
            (&*job.task, job.n)
        };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, task, n))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        if s.active.fetch_sub(1, Ordering::SeqCst) == 1 && s.caller_parked.load(Ordering::SeqCst) {
            // The caller set the flag under the lock and holds it until it waits.
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.shutdown.store(true, Ordering::Release);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadPool({} threads)", self.threads())
    }
}

/// Splits `0..len` into `parts` contiguous ranges of near-equal size (the first ones one
/// longer), for handing rows or columns to pool tasks.
pub fn chunk(len: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    let parts = parts.max(1);
    let base = len / parts;
    let extra = len % parts;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_exactly_once_across_many_jobs() {
        let pool = ThreadPool::new(3);
        for n in [0, 1, 2, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "n = {n}"
            );
        }
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(8, &|i| assert!(i != 5, "task 5"))
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(4, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn parked_workers_and_a_parked_caller_are_woken() {
        // Workers park between jobs spaced wider than their spin, and the caller parks while
        // a worker's task outlasts its spin: every job must still complete, whichever side
        // sleeps (a lost wake-up would hang this test).
        let pool = ThreadPool::new(3);
        for round in 0..20 {
            std::thread::sleep(std::time::Duration::from_millis(if round % 2 == 0 {
                5
            } else {
                0
            }));
            let count = AtomicUsize::new(0);
            pool.run(6, &|i| {
                if i == 5 && round % 3 == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                count.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(count.load(Ordering::Relaxed), 6, "round {round}");
        }
    }

    #[test]
    fn tasks_start_after_every_prelude_call_finished() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            let (written, seen) = (AtomicUsize::new(0), AtomicUsize::new(0));
            let fill = |_: usize| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                written.fetch_add(1, Ordering::Relaxed);
            };
            pool.run_after(
                Prelude {
                    tasks: 4,
                    run: &fill,
                },
                6,
                &|_| {
                    seen.fetch_add(written.load(Ordering::Relaxed), Ordering::Relaxed);
                },
            );
            assert_eq!(seen.load(Ordering::Relaxed), 6 * 4, "threads = {threads}");
        }
    }

    #[test]
    fn a_panicking_prelude_reaches_the_caller_without_hanging_the_tasks() {
        let pool = ThreadPool::new(2);
        let ran = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run_after(
                Prelude {
                    tasks: 2,
                    run: &|i| assert!(i != 1, "prelude 1"),
                },
                3,
                &|_| {
                    ran.fetch_add(1, Ordering::Relaxed);
                },
            )
        }));
        assert!(r.is_err());
        assert_eq!(ran.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn chunks_cover_the_range() {
        let ranges: Vec<_> = (0..3).map(|i| chunk(10, 3, i)).collect();
        assert_eq!(ranges, vec![0..4, 4..7, 7..10]);
    }
}
