//! This machine's streaming read bandwidth from DRAM: the bound a decode step that streams its
//! weights cannot beat (weight bytes per token ÷ bandwidth). `bench/peers/compare.py` runs it in
//! the same run as the systems it compares.
//!
//! Each pass sums a buffer far larger than the last-level cache (1 GiB by default), split into
//! one contiguous part per thread, with 256-bit loads where the CPU has AVX2, two ways: plain
//! loads (the hardware prefetchers alone), and with each line also requested into L2 8 KiB
//! ahead, as oxgen's weight kernels do (on a Zen 4 slice one core streams ~2x faster so). The
//! figure of each is the median over its passes after one unmeasured pass, in GB/s (10^9 bytes
//! per second); `gb_s` is the faster one's, the bound.
//!
//!     cargo run --release -p oxgen-kernels --example read_bandwidth -- [THREADS] [MIB] [PASSES]
//!
//! Prints one JSON object:
//! `{"threads":2,"mib":1024,"passes":10,"gb_s":{"median":..,"max":..},"plain":{..},"prefetched":{..}}`.

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
    // Backed by huge pages where the kernel grants them, as oxgen's packed weights ask to be.
    oxgen_kernels::mem::advise_huge_pages(&mut buffer);
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
    let mut check = 0u64;
    let mut measure = |prefetch: bool| {
        let mut rates = Vec::with_capacity(passes);
        for pass in 0..=passes {
            let start = Instant::now();
            let sums: Vec<u64> = std::thread::scope(|s| {
                let handles: Vec<_> = buffer
                    .chunks(part)
                    .map(|c| s.spawn(move || sum(c, prefetch)))
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
        (rates[rates.len() / 2], rates[rates.len() - 1])
    };
    let plain = measure(false);
    let prefetched = measure(true);
    let best = if prefetched.0 > plain.0 {
        prefetched
    } else {
        plain
    };
    let json = |(median, max): (f64, f64)| format!("{{\"median\":{median:.2},\"max\":{max:.2}}}");
    println!(
        "{{\"threads\":{threads},\"mib\":{mib},\"passes\":{passes},\"gb_s\":{},\"plain\":{},\"prefetched\":{},\"check\":{check}}}",
        json(best),
        json(plain),
        json(prefetched)
    );
}

fn sum(words: &[u64], prefetch: bool) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected at run time.
        return unsafe {
            if prefetch {
                sum_avx2::<true>(words)
            } else {
                sum_avx2::<false>(words)
            }
        };
    }
    let _ = prefetch;
    words.iter().fold(0u64, |a, &w| a.wrapping_add(w))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2<const PREFETCH: bool>(words: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    const AHEAD: usize = 8192;
    let mut acc = [_mm256_setzero_si256(); 4];
    let blocks = words.chunks_exact(16);
    let tail = blocks.remainder();
    for block in blocks {
        let p = block.as_ptr().cast::<__m256i>();
        if PREFETCH {
            // The block's two lines, AHEAD bytes on (a prefetch never faults).
            let ahead = block.as_ptr().cast::<i8>().wrapping_add(AHEAD);
            _mm_prefetch::<_MM_HINT_T1>(ahead);
            _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64));
        }
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
