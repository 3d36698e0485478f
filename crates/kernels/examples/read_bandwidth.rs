//! This machine's streaming read bandwidth from DRAM: the bound a decode step that streams its
//! weights cannot beat (weight bytes per token ÷ bandwidth). `bench/peers/compare.py` runs it in
//! the same run as the systems it compares.
//!
//! Each pass sums a buffer far larger than the last-level cache (1 GiB by default), split into
//! one contiguous part per thread, with 256-bit loads where the CPU has AVX2; the figure is the
//! median over the passes after one unmeasured pass, in GB/s (10^9 bytes per second).
//!
//!     cargo run --release -p oxgen-kernels --example read_bandwidth -- [THREADS] [MIB] [PASSES]
//!
//! Prints one JSON object: `{"threads":2,"mib":1024,"passes":10,"gb_s":{"median":..,"max":..}}`.

use std::time::Instant;

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args().nth(i).map_or(default, |s| {
            s.parse().unwrap_or_else(|_| {
                eprintln!("read_bandwidth: argument {i} ({s:?}) is not a whole number");
                eprintln!("usage: read_bandwidth [THREADS] [MIB] [PASSES]");
                std::process::exit(2)
            })
        })
    };
    let threads = arg(1, 2).max(1);
    let mib = arg(2, 1024).max(1);
    let passes = arg(3, 10).max(1);
    let words = mib << 17; // u64s
    let part = words.div_ceil(threads).next_multiple_of(16);
    let mut buffer = vec![0u64; words];
    // Each thread writes (and so maps) the part it will read.
    std::thread::scope(|s| {
        for (t, chunk) in buffer.chunks_mut(part).enumerate() {
            s.spawn(move || {
                for (i, w) in chunk.iter_mut().enumerate() {
                    *w = (t * part + i) as u64;
                }
            });
        }
    });
    let mut rates = Vec::with_capacity(passes);
    let mut check = 0u64;
    for pass in 0..=passes {
        let start = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = buffer
                .chunks(part)
                .map(|c| s.spawn(move || sum(c)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        let seconds = start.elapsed().as_secs_f64();
        check = check.wrapping_add(sums.iter().fold(0u64, |a, &b| a.wrapping_add(b)));
        if pass > 0 {
            rates.push((words * 8) as f64 / seconds / 1e9);
        }
    }
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    let max = rates[rates.len() - 1];
    println!(
        "{{\"threads\":{threads},\"mib\":{mib},\"passes\":{passes},\"gb_s\":{{\"median\":{median:.2},\"max\":{max:.2}}},\"check\":{check}}}"
    );
}

fn sum(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected at run time.
        return unsafe { sum_avx2(words) };
    }
    words.iter().fold(0u64, |a, &w| a.wrapping_add(w))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(words: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    let blocks = words.chunks_exact(16);
    let tail = blocks.remainder();
    for block in blocks {
        let p = block.as_ptr().cast::<__m256i>();
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: `block` holds 16 u64s, four 256-bit vectors; unaligned loads.
            *a = _mm256_add_epi64(*a, unsafe { _mm256_loadu_si256(p.add(j)) });
        }
    }
    let mut lanes = [0u64; 4];
    let total = _mm256_add_epi64(
        _mm256_add_epi64(acc[0], acc[1]),
        _mm256_add_epi64(acc[2], acc[3]),
    );
    // SAFETY: `lanes` holds four u64s.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), total) };
    lanes
        .iter()
        .chain(tail)
        .fold(0u64, |a, &w| a.wrapping_add(w))
}
