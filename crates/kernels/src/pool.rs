//! A persistent worker pool for data-parallel kernels.
//!
//! `run(n, f)` calls `f(0..n)` across the caller and the workers and returns when all calls
//! are done. Workers spin briefly on the job state, then park on a condition variable, so
//! back-to-back kernel calls (the decode pattern) avoid both thread spawns and wake-up
//! latency. Tasks are claimed from an atomic counter; which thread runs a task never changes
//! its result (callers split output columns or rows, never a reduction).
//!
//! **Shared machines.** Another process may hold a worker's core. The caller never waits for
//! a worker that has not started on the job: a worker *enters* a job before it claims a task,
//! and the caller, once every task is claimed, waits only for the workers inside, then
//! *closes* the job so a late worker skips it. A descheduled worker thus costs the region
//! nothing unless it holds a claimed task, and the caller runs every task no one else
//! claimed. Waiting threads spin for a few microseconds, then yield their core (to the
//! thread they wait for, when it shares the core) up to [`SPIN_TIME`], then park. A pool
//! made by [`ThreadPool::leaving_room`] also runs its regions on fewer threads while other
//! processes keep some of its cores busy (`room.rs`).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::room::Room;

/// Spin iterations before a waiting thread starts yielding its core.
const SPIN_LIMIT: u32 = 2_000;
/// How long a waiting thread spins and yields before it parks.
const SPIN_TIME: Duration = Duration::from_micros(50);

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

/// The job state in one word: the job's number (high 32 bits), whether it is closed, and
/// how many workers are inside it (low bits).
const CLOSED: u64 = 1 << 31;
const INSIDE: u64 = CLOSED - 1;

fn job_of(state: u64) -> u64 {
    state >> 32
}

struct Shared {
    /// See [`CLOSED`]. A worker enters an open job it has not seen by adding one; the caller
    /// writes `job` only while the state is closed.
    state: AtomicU64,
    job: UnsafeCell<Job>,
    next: AtomicUsize,
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
    /// Workers that have started (see [`ThreadPool::new`]).
    started: AtomicUsize,
    /// Threads the open job may run on, the caller included: workers numbered from this on
    /// skip it (see [`ThreadPool::leaving_room`]).
    active: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    done: Condvar,
}

// SAFETY: `job` is written only by `run` while the state is closed (no worker inside, and
// none can enter), and read by workers only while inside an open job, during which `run`
// waits; the task it points to outlives that window.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

fn nop(_: usize) {}

/// Spins, then yields the core, while `waiting()` holds, for at most [`SPIN_TIME`]; false
/// when the wait is still on (the caller parks then).
fn spin_until(waiting: impl Fn() -> bool) -> bool {
    let mut spins = 0u32;
    let mut since: Option<Instant> = None;
    while waiting() {
        if spins < SPIN_LIMIT {
            spins += 1;
            std::hint::spin_loop();
            continue;
        }
        let start = *since.get_or_insert_with(Instant::now);
        if start.elapsed() >= SPIN_TIME {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

/// A fixed set of worker threads plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes `run` calls from different threads sharing one pool.
    running: Mutex<()>,
    /// How many threads the machine leaves this pool, when it leaves room.
    room: Option<Room>,
}

impl ThreadPool {
    /// A pool that uses `threads` threads in all (the caller counts as one), or as many as
    /// the system lets it start ([`ThreadPool::threads`] says how many it got).
    pub fn new(threads: usize) -> ThreadPool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(CLOSED),
            job: UnsafeCell::new(Job {
                task: &nop as &(dyn Fn(usize) + Sync),
                n: 0,
            }),
            next: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            caller_parked: AtomicBool::new(false),
            started: AtomicUsize::new(0),
            active: AtomicUsize::new(threads),
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
                    .spawn(move || worker(&shared, i))
                    .ok()
            })
            .collect::<Vec<_>>();
        // Each worker's start-up (the runtime's thread set-up allocates) is over before the
        // pool is used: a kernel call never meets it (DESIGN.md §5.4, no allocation per step).
        while shared.started.load(Ordering::Acquire) < workers.len() {
            std::thread::yield_now();
        }
        ThreadPool {
            shared,
            workers,
            running: Mutex::new(()),
            room: None,
        }
    }

    /// A pool of `threads` threads that runs its regions on fewer while other processes
    /// hold the cores it may run on: as many as they leave free, at least the caller
    /// (sampled twice a second from the system's counters, `room.rs`). Which threads run a
    /// task never changes its result. Where the load cannot be read, [`ThreadPool::new`].
    pub fn leaving_room(threads: usize) -> ThreadPool {
        let mut pool = ThreadPool::new(threads);
        if pool.threads() > 1 {
            pool.room = Room::new(pool.threads());
        }
        pool
    }

    /// Threads that run tasks, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `task(i)` for every `i` in `0..n`, in parallel, and waits for all of them.
    pub fn run(&self, n: usize, task: Task<'_>) {
        let active = if self.workers.is_empty() || n <= 1 {
            1
        } else {
            self.room.as_ref().map_or(self.threads(), Room::active)
        };
        if active <= 1 {
            (0..n).for_each(task);
            return;
        }
        let _running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        s.active.store(active, Ordering::Relaxed);
        let closed = s.state.load(Ordering::SeqCst);
        debug_assert!(closed & CLOSED != 0 && closed & INSIDE == 0);
        // SAFETY: the state is closed: no worker is inside or can enter, so nothing reads
        // `job` now; the lifetime is erased because this call waits for every worker inside
        // to finish with the task, and closes the job, before returning.
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
        let open = (job_of(closed).wrapping_add(1) & u64::from(u32::MAX)) << 32;
        s.state.store(open, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            // A parked worker announced itself under the lock and holds it until it waits,
            // so taking the lock here means it is waiting and hears this.
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        // The caller claims until every task is taken, past a panicking one (whose panic it
        // rethrows at the end): no task may wait for a worker that never comes.
        let mut caller = Ok(());
        while let Err(p) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, task, n)))
        {
            caller = caller.and(Err(p));
        }
        // Every task is claimed now: wait for the workers inside, then close the job.
        loop {
            let cur = s.state.load(Ordering::SeqCst);
            if cur & INSIDE == 0 {
                if (s.state)
                    .compare_exchange(cur, cur | CLOSED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    break;
                }
                continue;
            }
            if spin_until(|| s.state.load(Ordering::Acquire) & INSIDE != 0) {
                continue;
            }
            let g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.caller_parked.store(true, Ordering::SeqCst);
            if s.state.load(Ordering::SeqCst) & INSIDE != 0 {
                drop(s.done.wait(g).unwrap_or_else(|e| e.into_inner()));
            }
            s.caller_parked.store(false, Ordering::SeqCst);
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
            // A prelude call runs on a thread that may be descheduled: yield to it.
            while !spin_until(|| finished.load(Ordering::Acquire) < prelude.tasks) {
                std::thread::yield_now();
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

/// Worker `index` (1 and up; the caller is 0) of the pool.
fn worker(s: &Shared, index: usize) {
    s.started.fetch_add(1, Ordering::Release);
    // The last job this worker entered or saw closed.
    let mut seen = job_of(s.state.load(Ordering::SeqCst));
    loop {
        let fresh = |state: u64| state & CLOSED == 0 && job_of(state) != seen;
        if !spin_until(|| {
            !fresh(s.state.load(Ordering::Acquire)) && !s.shutdown.load(Ordering::Acquire)
        }) {
            let g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            if !fresh(s.state.load(Ordering::SeqCst)) && !s.shutdown.load(Ordering::SeqCst) {
                drop(s.wake.wait(g).unwrap_or_else(|e| e.into_inner()));
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Enter the job, unless it closed (or another began) meanwhile.
        let cur = s.state.load(Ordering::SeqCst);
        if !fresh(cur) {
            continue;
        }
        // A job that runs on fewer threads than there are: seen, not entered. (The caller
        // stores `active` before it opens the job, which this thread has just seen.)
        if index >= s.active.load(Ordering::Relaxed) {
            seen = job_of(cur);
            continue;
        }
        if (s.state)
            .compare_exchange(cur, cur + 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            continue;
        }
        seen = job_of(cur);
        // SAFETY: see `Shared`: the job stays valid while this worker is inside.
        let (task, n) = unsafe {
            let job = &*s.job.get();
            (&*job.task, job.n)
        };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, task, n))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        let before = s.state.fetch_sub(1, Ordering::SeqCst);
        if before & INSIDE == 1 && s.caller_parked.load(Ordering::SeqCst) {
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

    /// Jobs back to back while busy threads take the cores, so workers are descheduled at
    /// every point of the protocol (before entering, inside, after a job closed): every task
    /// of every job runs exactly once, and none from a closed job runs late.
    #[test]
    fn jobs_stay_exact_while_other_threads_hold_the_cores() {
        let stop = Arc::new(AtomicBool::new(false));
        let hogs: Vec<_> = (0..2)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let pool = ThreadPool::new(3);
        for job in 0..5_000usize {
            let n = 1 + job % 7;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            for (i, h) in hits.iter().enumerate() {
                assert_eq!(h.load(Ordering::Relaxed), 1, "job {job}, task {i}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        hogs.into_iter().for_each(|h| h.join().unwrap());
    }

    #[test]
    fn a_pool_leaving_room_runs_every_task_on_any_share_of_its_threads() {
        let mut pool = ThreadPool::new(3);
        for active in [1, 2, 3, 1] {
            pool.room = Some(Room::fixed(3, active));
            for n in [1, 2, 7, 64] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
        // The machine's own counters: whatever share they give, every task runs once.
        let pool = ThreadPool::leaving_room(2);
        let sum = AtomicUsize::new(0);
        for _ in 0..100 {
            pool.run(16, &|i| {
                sum.fetch_add(i, Ordering::Relaxed);
            });
        }
        assert_eq!(sum.load(Ordering::Relaxed), 100 * (0..16).sum::<usize>());
    }

    #[test]
    fn chunks_cover_the_range() {
        let ranges: Vec<_> = (0..3).map(|i| chunk(10, 3, i)).collect();
        assert_eq!(ranges, vec![0..4, 4..7, 7..10]);
    }
}
