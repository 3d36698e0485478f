//! The weight budget (`--weight-budget`): which mixture-of-experts weights are resident.
//!
//! Under a budget, expert weights are read where they lie, in the memory-mapped model files
//! (without one, the experts whose kernel takes them repacked, integer experts with f32
//! activations and MXFP4 experts with int8 activations, are repacked into memory of their own
//! at load, `crate::ops::moe::prepack`, and the counters below count those); a page the
//! kernels read counts in the process's RSS (as file-backed memory) until it is dropped. With a
//! budget, every expert a step computes is touched here; when the experts touched exceed the
//! budget, the least often used ([`ExpertCache::Frequency`], the default) or the least
//! recently used ([`ExpertCache::Lru`]) are dropped from the mapping
//! (`madvise(MADV_DONTNEED)` on the pages wholly inside their bytes), so resident expert bytes
//! stay within the budget and the next use of a dropped expert reads it again from the page
//! cache or the disk. Without a budget nothing is dropped, and the counters still say what a
//! step used.
//!
//! Only pages of the model's file mappings are ever dropped: a range is checked against the
//! file-backed mappings of `/proc/self/maps` (anonymous memory would read back as zeros).
//! Results never change with the budget: a dropped page reads back the same bytes.

use std::collections::HashMap;

use oxgen_runtime::ExpertResidency as ResidencyCounters;

/// Which resident experts a weight budget drops first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ExpertCache {
    /// The least recently used.
    Lru,
    /// The default (a higher hit rate than [`ExpertCache::Lru`] at every partial budget
    /// measured, docs/PERFORMANCE.md): the least often used (uses counted over the run,
    /// resident or not, halved every [`DECAY_TOUCHES`] uses so the count follows what the
    /// text routes to now), the least recently used among equals.
    #[default]
    Frequency,
}

impl ExpertCache {
    /// The name `--expert-cache` takes.
    pub fn name(self) -> &'static str {
        match self {
            ExpertCache::Lru => "lru",
            ExpertCache::Frequency => "frequency",
        }
    }
}

impl std::str::FromStr for ExpertCache {
    type Err = String;

    fn from_str(s: &str) -> Result<ExpertCache, String> {
        [ExpertCache::Lru, ExpertCache::Frequency]
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("'{s}' is not an expert cache policy: lru or frequency"))
    }
}

/// Uses between two halvings of every expert's count ([`ExpertCache::Frequency`]).
const DECAY_TOUCHES: u64 = 4096;

struct Entry {
    stamp: u64,
    bytes: u64,
    ranges: Vec<(usize, usize)>,
}

/// Resident experts, the least often (or least recently) used first out (see the module doc).
pub struct Residency {
    budget: Option<u64>,
    policy: ExpertCache,
    entries: HashMap<(usize, usize), Entry>,
    /// Each expert's uses, halved every [`DECAY_TOUCHES`] ([`ExpertCache::Frequency`]).
    uses: HashMap<(usize, usize), u32>,
    clock: u64,
    counters: ResidencyCounters,
    /// File-backed mappings `[start, end)`, read once when first needed.
    file_maps: Option<Vec<(usize, usize)>>,
}

impl Residency {
    pub fn new(budget: Option<u64>, policy: ExpertCache) -> Residency {
        Residency {
            budget,
            policy,
            entries: HashMap::new(),
            uses: HashMap::new(),
            clock: 0,
            counters: ResidencyCounters {
                budget: budget.unwrap_or(0),
                ..ResidencyCounters::default()
            },
            file_maps: None,
        }
    }

    pub fn counters(&self) -> ResidencyCounters {
        self.counters
    }

    /// Expert `key` was used, its weights lying in `ranges` (byte slices); then evicts down
    /// to the budget.
    pub fn touch(&mut self, key: (usize, usize), ranges: &[&[u8]]) {
        self.clock += 1;
        if self.policy == ExpertCache::Frequency && self.budget.is_some() {
            if self.clock.is_multiple_of(DECAY_TOUCHES) {
                self.uses.values_mut().for_each(|n| *n /= 2);
            }
            let n = self.uses.entry(key).or_insert(0);
            *n = n.saturating_add(1);
        }
        let c = &mut self.counters;
        match self.entries.get_mut(&key) {
            Some(e) => {
                e.stamp = self.clock;
                c.hits += 1;
            }
            None => {
                let bytes: u64 = ranges.iter().map(|r| r.len() as u64).sum();
                c.misses += 1;
                c.miss_bytes += bytes;
                c.resident_bytes += bytes;
                c.peak_bytes = c.peak_bytes.max(c.resident_bytes);
                let ranges = ranges
                    .iter()
                    .map(|r| (r.as_ptr() as usize, r.len()))
                    .collect();
                self.entries.insert(
                    key,
                    Entry {
                        stamp: self.clock,
                        bytes,
                        ranges,
                    },
                );
            }
        }
        let Some(budget) = self.budget else { return };
        while self.counters.resident_bytes > budget {
            let uses = |k: &(usize, usize)| match self.policy {
                ExpertCache::Lru => 0,
                ExpertCache::Frequency => self.uses.get(k).copied().unwrap_or(0),
            };
            let victim = (self.entries.iter()).min_by_key(|(k, e)| (uses(k), e.stamp));
            let Some((&oldest, _)) = victim else {
                break;
            };
            let entry = self.entries.remove(&oldest).expect("found above");
            self.drop_pages(&entry.ranges);
            self.counters.resident_bytes -= entry.bytes;
            self.counters.evictions += 1;
        }
    }

    /// Drops the pages wholly inside `ranges` that lie in a file-backed mapping.
    fn drop_pages(&mut self, ranges: &[(usize, usize)]) {
        let page = page_size();
        let maps = self.file_maps.get_or_insert_with(file_backed_maps);
        for &(start, len) in ranges {
            let (lo, hi) = (start.next_multiple_of(page), (start + len) / page * page);
            if hi <= lo || !maps.iter().any(|&(s, e)| s <= lo && hi <= e) {
                continue;
            }
            // SAFETY: `lo..hi` is whole pages of a read-only file mapping that stays mapped
            // (the session holds the model's tensors); dropping them only makes the next read
            // fault the same bytes back in.
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED) };
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

/// The file-backed mappings of this process (`/proc/self/maps` lines with an inode), as
/// `[start, end)`; none when the file cannot be read (nothing is then dropped).
fn file_backed_maps() -> Vec<(usize, usize)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (range, _perms, _offset, _dev, inode) = (
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
            );
            if inode == "0" {
                return None;
            }
            let (s, e) = range.split_once('-')?;
            Some((
                usize::from_str_radix(s, 16).ok()?,
                usize::from_str_radix(e, 16).ok()?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_go_first_and_heap_memory_is_never_dropped() {
        // Three "experts" of two pages each on the heap, a budget of two of them.
        let page = page_size();
        let data = vec![7u8; 6 * page];
        let part = |i: usize| &data[2 * page * i..][..2 * page];
        let mut r = Residency::new(Some(4 * page as u64), ExpertCache::Lru);
        r.touch((1, 0), &[part(0)]);
        r.touch((1, 1), &[part(1)]);
        r.touch((1, 0), &[part(0)]);
        r.touch((1, 2), &[part(2)]);
        let c = r.counters();
        assert_eq!((c.hits, c.misses, c.evictions), (1, 3, 1));
        assert_eq!(c.resident_bytes, 4 * page as u64);
        assert_eq!(c.peak_bytes, 6 * page as u64);
        // Expert 1 (least recently used) went; 0 and 2 stay.
        r.touch((1, 0), &[part(0)]);
        r.touch((1, 2), &[part(2)]);
        assert_eq!(r.counters().hits, 3);
        // The heap bytes were not dropped (they would read back as zeros).
        assert!(data.iter().all(|&b| b == 7));
    }

    #[test]
    fn the_least_often_used_go_first_under_the_frequency_policy() {
        // The same uses as above; expert 0, used twice, outlives expert 2 (used once, later).
        let page = page_size();
        let data = vec![7u8; 6 * page];
        let part = |i: usize| &data[2 * page * i..][..2 * page];
        let mut r = Residency::new(Some(4 * page as u64), ExpertCache::Frequency);
        r.touch((1, 0), &[part(0)]);
        r.touch((1, 0), &[part(0)]);
        r.touch((1, 1), &[part(1)]);
        // Over the budget: 1 goes (used once, before 2), not 0 (used twice; least recently
        // used, so the LRU policy would drop it).
        r.touch((1, 2), &[part(2)]);
        r.touch((1, 0), &[part(0)]);
        r.touch((1, 1), &[part(1)]);
        let c = r.counters();
        assert_eq!((c.hits, c.misses, c.evictions), (2, 4, 2), "{c:?}");
        // Expert 1 came back (its second use); 2, used once, went for it.
        r.touch((1, 0), &[part(0)]);
        assert_eq!(r.counters().hits, 3);
        assert!(data.iter().all(|&b| b == 7));
    }

    #[test]
    fn without_a_budget_nothing_is_dropped() {
        let data = [1u8; 64];
        let mut r = Residency::new(None, ExpertCache::Frequency);
        for i in 0..4 {
            r.touch((0, i), &[&data[16 * i..][..16]]);
        }
        let c = r.counters();
        assert_eq!(
            (c.misses, c.evictions, c.resident_bytes, c.budget),
            (4, 0, 64, 0)
        );
    }
}
