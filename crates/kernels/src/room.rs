//! Room on a shared machine: how many of a pool's threads to run while other processes hold
//! cores. A pool that leaves room ([`crate::ThreadPool::leaving_room`]) samples, every
//! [`PERIOD`], how busy the CPUs it may run on are (`/proc/stat`, over the CPUs of the
//! process's affinity mask) less its own CPU time (`getrusage`), and runs its regions on as
//! many threads as there are cores the others leave free, at least the caller. Beside one
//! busy process on two cores, one thread decodes faster than two that share the cores with
//! it (docs/PERFORMANCE.md, "Shared machines"); on a quiet machine every thread runs.
//! Elsewhere than Linux the pool runs every thread.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How often the load is sampled (each sample reads `/proc/stat`, tens of microseconds).
const PERIOD: Duration = Duration::from_millis(500);

/// Cores a thread needs free, beyond whole ones, to run: with 1.75 cores free two threads
/// run, with 1.6 one.
const SLACK: f64 = 0.25;

/// The threads a pool of `threads` runs on `cpus` CPUs when other processes did `others`
/// cores' worth of work there while it ran `active` threads.
///
/// The others' work alone does not say how many of them want a core: beside this pool's two
/// threads on two cores, one busy process gets 2/3 of a core and two get one core in all.
/// Taking each of this pool's `active` threads and each of `n` other busy threads as
/// runnable throughout, the others get `cpus * n / (n + active)` when they are more than the
/// cores, so `n = others * active / (cpus - others)` (exact when they fit, too). When
/// fewer than `cpus - 1/2` of them want a core, the pool runs on the cores they leave free
/// (rounded down unless within [`SLACK`] of the next, at least one): a thread that shares a
/// core is descheduled mid-region and the others wait for it. When the others want every
/// core, each runnable thread gets its share of the cores, and the pool's threads take more
/// of them than its caller alone: every thread runs (measured: beside two busy processes on
/// two cores, two threads decode 1.2x faster than one).
pub(crate) fn threads_for(cpus: usize, others: f64, active: usize, threads: usize) -> usize {
    let (cpus, others) = (cpus as f64, others.max(0.0));
    let wanting = others * active.max(1) as f64 / (cpus - others).max(1e-3);
    if wanting >= cpus - 0.5 {
        return threads.max(1);
    }
    ((cpus - wanting + SLACK).floor() as usize).clamp(1, threads.max(1))
}

/// A pool's view of the machine's load (see the module doc).
pub(crate) struct Room {
    threads: usize,
    active: AtomicUsize,
    sampler: Mutex<Sampler>,
}

struct Sampler {
    /// The CPUs this process may run on (its affinity mask when the pool was made).
    cpus: Vec<usize>,
    /// `/proc/stat` is read into this, allocated once.
    buf: Vec<u8>,
    last: Option<Sample>,
}

/// The counters at one instant: busy and total jiffies over the pool's CPUs, and this
/// process's CPU time.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    at: Instant,
    busy: u64,
    total: u64,
    own: Duration,
}

impl Room {
    /// Room for a pool of `threads` threads; `None` where the load cannot be read.
    pub(crate) fn new(threads: usize) -> Option<Room> {
        let cpus = affinity()?;
        let mut sampler = Sampler {
            cpus,
            buf: Vec::with_capacity(1 << 16),
            last: None,
        };
        sampler.last = Some(sampler.sample()?);
        Some(Room {
            threads,
            active: AtomicUsize::new(threads),
            sampler: Mutex::new(sampler),
        })
    }

    /// Room that always gives `active` of `threads` threads (it never samples).
    #[cfg(test)]
    pub(crate) fn fixed(threads: usize, active: usize) -> Room {
        Room {
            threads,
            active: AtomicUsize::new(active),
            sampler: Mutex::new(Sampler {
                cpus: Vec::new(),
                buf: Vec::new(),
                last: None,
            }),
        }
    }

    /// The threads to run a region on now: resampled once [`PERIOD`] has passed since the
    /// last sample (by whichever caller finds the sampler free; none waits for it).
    pub(crate) fn active(&self) -> usize {
        if let Ok(mut sampler) = self.sampler.try_lock() {
            let due =
                !sampler.cpus.is_empty() && sampler.last.is_none_or(|s| s.at.elapsed() >= PERIOD);
            if due && let Some(now) = sampler.sample() {
                if let Some(before) = sampler.last {
                    let others = others_busy(&before, &now, clock_ticks());
                    let active = self.active.load(Ordering::Relaxed);
                    let active = threads_for(sampler.cpus.len(), others, active, self.threads);
                    self.active.store(active, Ordering::Relaxed);
                }
                sampler.last = Some(now);
            }
        }
        self.active.load(Ordering::Relaxed)
    }
}

/// Cores' worth of work other processes did on the pool's CPUs between two samples:
/// all busy time (jiffies of `ticks` a second) less this process's own.
fn others_busy(before: &Sample, now: &Sample, ticks: f64) -> f64 {
    let wall = now.at.duration_since(before.at).as_secs_f64();
    if wall <= 0.0 {
        return 0.0;
    }
    let busy = now.busy.saturating_sub(before.busy) as f64 / ticks;
    let own = now.own.saturating_sub(before.own).as_secs_f64();
    (busy - own).max(0.0) / wall
}

impl Sampler {
    fn sample(&mut self) -> Option<Sample> {
        use std::io::Read;
        let at = Instant::now();
        self.buf.clear();
        std::fs::File::open("/proc/stat")
            .ok()?
            .read_to_end(&mut self.buf)
            .ok()?;
        let (busy, total) = cpu_jiffies(std::str::from_utf8(&self.buf).ok()?, &self.cpus)?;
        Some(Sample {
            at,
            busy,
            total,
            own: own_cpu_time()?,
        })
    }
}

/// Busy and total jiffies summed over the `cpus` lines of a `/proc/stat` text (`cpuN user
/// nice system idle iowait irq softirq steal ...`). Idle and iowait are not busy, nor is
/// steal (a hypervisor running another machine on the CPU: no process here to leave room
/// for, and quiet VMs measured two threads faster than one through it).
fn cpu_jiffies(stat: &str, cpus: &[usize]) -> Option<(u64, u64)> {
    let (mut busy, mut total, mut found) = (0u64, 0u64, 0usize);
    for line in stat.lines() {
        let mut fields = line.split_ascii_whitespace();
        let Some(cpu) = fields.next().and_then(|f| f.strip_prefix("cpu")) else {
            continue;
        };
        if !cpu.parse().is_ok_and(|n: usize| cpus.contains(&n)) {
            continue;
        }
        // No allocation: the pool samples while it decodes.
        let mut counts = [0u64; 8];
        let mut read = 0;
        for (c, f) in counts.iter_mut().zip(fields) {
            *c = f.parse().ok()?;
            read += 1;
        }
        if read < 5 {
            return None;
        }
        let all: u64 = counts.iter().sum();
        total += all;
        busy += all - counts[3] - counts[4] - counts[7];
        found += 1;
    }
    (found > 0).then_some((busy, total))
}

#[cfg(target_os = "linux")]
fn affinity() -> Option<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call fills it for this thread.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        set
    };
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect();
    (!cpus.is_empty()).then_some(cpus)
}

#[cfg(not(target_os = "linux"))]
fn affinity() -> Option<Vec<usize>> {
    None
}

/// This process's user and system CPU time.
#[cfg(target_os = "linux")]
fn own_cpu_time() -> Option<Duration> {
    // SAFETY: a zeroed rusage is valid; the call fills it.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return None;
        }
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Some(time(usage.ru_utime) + time(usage.ru_stime))
}

#[cfg(not(target_os = "linux"))]
fn own_cpu_time() -> Option<Duration> {
    None
}

/// Jiffies a second in `/proc/stat`.
fn clock_ticks() -> f64 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if ticks > 0 {
            return ticks as f64;
        }
    }
    100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_cores_decide_the_threads() {
        // Quiet: every thread.
        assert_eq!(threads_for(2, 0.02, 2, 2), 2);
        // One busy process on two cores, seen beside two threads (2/3 of a core) and beside
        // one (a whole core): one thread.
        assert_eq!(threads_for(2, 0.67, 2, 2), 1);
        assert_eq!(threads_for(2, 1.0, 1, 2), 1);
        // Two busy processes, seen beside two threads (one core) and one (4/3): every
        // thread, for its share.
        assert_eq!(threads_for(2, 1.0, 2, 2), 2);
        assert_eq!(threads_for(2, 1.33, 1, 2), 2);
        // Two busy processes on eight cores beside six threads: six.
        assert_eq!(threads_for(8, 2.0, 6, 8), 6);
        // Never none, never more than the pool has, whatever the counters say.
        assert_eq!(threads_for(8, 0.0, 4, 4), 4);
        assert_eq!(threads_for(1, 3.0, 1, 1), 1);
        assert_eq!(threads_for(4, -1.0, 4, 4), 4);
        assert_eq!(threads_for(2, 2.0, 2, 2), 2);
    }

    #[test]
    fn reads_the_jiffies_of_its_cpus() {
        let stat = "cpu  100 0 50 800 50 0 0 0 0 0\n\
                    cpu0 10 0 5 80 5 0 0 0 0 0\n\
                    cpu1 20 1 4 70 3 1 1 0 0 0\n\
                    cpu2 30 0 0 60 0 0 0 10 0 0\n\
                    intr 5 6\nctxt 7\n";
        // cpu0: busy 15 of 100; cpu2: busy 30 of 100 (its 10 of steal are not).
        assert_eq!(cpu_jiffies(stat, &[0, 2]), Some((45, 200)));
        assert_eq!(cpu_jiffies(stat, &[1]), Some((27, 100)));
        assert_eq!(cpu_jiffies(stat, &[5]), None);
        assert_eq!(cpu_jiffies("cpu0 1 2\n", &[0]), None);
    }

    #[test]
    fn others_are_the_busy_time_less_our_own() {
        let at = Instant::now();
        let before = Sample {
            at,
            busy: 1000,
            total: 5000,
            own: Duration::from_millis(300),
        };
        // Over half a second at 100 jiffies a second: 80 busy jiffies (0.8 s) of which
        // 0.3 s ours: 0.5 s of others' work, one core's worth.
        let now = Sample {
            at: at + Duration::from_millis(500),
            busy: 1080,
            total: 5100,
            own: Duration::from_millis(600),
        };
        assert!((others_busy(&before, &now, 100.0) - 1.0).abs() < 1e-9);
        // Our own time counted past the jiffies (their coarser clock): nobody else.
        let mine = Sample {
            own: Duration::from_millis(1200),
            ..now
        };
        assert_eq!(others_busy(&before, &mine, 100.0), 0.0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn samples_this_machine() {
        let room = Room::new(4).expect("Linux has /proc/stat and an affinity mask");
        let active = room.active();
        assert!((1..=4).contains(&active), "{active}");
    }
}
