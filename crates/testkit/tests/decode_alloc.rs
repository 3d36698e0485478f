//! DESIGN.md §5.4: a steady-state decode step allocates nothing on the heap — the model step
//! (executor, kernels, KV in place) and the sampler alike. A counting global allocator
//! watches every thread (the kernel pool's workers included) while decode steps run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use oxgen_exec::{ExecOptions, NativeLm, NativeOptions};
use oxgen_runtime::{Batch, LanguageModel, LogitsWanted, SeqStep, StepLogits};
use oxgen_testkit::fixtures::{FixtureConfig, write_package};
use oxgen_testkit::optimum::write_optimum_package;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
/// Where the first counted allocation came from, to say what to fix when the test fails.
static FIRST: Mutex<Option<String>> = Mutex::new(None);

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

fn counted() {
    if !COUNTING.load(Ordering::Relaxed) || IN_HOOK.with(Cell::get) {
        return;
    }
    if ALLOCATIONS.fetch_add(1, Ordering::Relaxed) == 0 {
        IN_HOOK.with(|h| h.set(true));
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        if let Ok(mut first) = FIRST.lock() {
            *first = Some(trace);
        }
        IN_HOOK.with(|h| h.set(false));
    }
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed through.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted();
        // SAFETY: the caller's contract is passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn count<R>(f: impl FnOnce() -> R) -> (R, usize) {
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let r = f();
    COUNTING.store(false, Ordering::SeqCst);
    (r, ALLOCATIONS.load(Ordering::SeqCst))
}

/// The backtrace of the first allocation counted, trimmed to oxgen's frames.
fn first_allocation() -> String {
    let trace = FIRST
        .lock()
        .ok()
        .and_then(|f| f.clone())
        .unwrap_or_default();
    trace
        .lines()
        .filter(|l| l.contains("oxgen") || l.contains("at ./") || l.contains("crates/"))
        .take(16)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The counter is global: tests measure one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Decode steps on `model.onnx` in `dir` at 1 and 2 threads: allocations per step.
fn allocations_per_decode_step(dir: &std::path::Path) -> Vec<(usize, Vec<usize>)> {
    // Rotary caches sized to the context, as `oxgen::Model::open` sizes them.
    let mut found = Vec::new();
    for threads in [1, 2] {
        let options = NativeOptions {
            exec: ExecOptions {
                threads,
                ..Default::default()
            },
            context_length: Some(64),
            ..NativeOptions::default()
        };
        let mut lm = NativeLm::open(&dir.join("model.onnx"), &options).unwrap();
        let seq = lm.add_sequence(64).unwrap();
        let mut out = StepLogits::default();
        let step = |lm: &mut NativeLm, tokens: &[u32], pos: usize, out: &mut StepLogits| {
            let steps = [SeqStep {
                seq,
                tokens,
                pos,
                logits: LogitsWanted::Last,
                proposed: 0,
            }];
            lm.step(&Batch { steps: &steps }, out).unwrap();
        };
        step(&mut lm, &[5, 6, 7, 8], 0, &mut out);
        // Two warm-up decode steps size every buffer for one-token steps.
        let mut pos = 4;
        for t in [9, 10] {
            step(&mut lm, &[t], pos, &mut out);
            pos += 1;
        }
        let mut counts = Vec::new();
        for t in 11..19 {
            let ((), n) = count(|| step(&mut lm, &[t], pos, &mut out));
            counts.push(n);
            pos += 1;
        }
        found.push((threads, counts));
    }
    found
}

fn assert_no_allocations(found: &[(usize, Vec<usize>)]) {
    for (threads, counts) in found {
        assert!(
            counts.iter().all(|&n| n == 0),
            "threads {threads}: allocations per decode step: {counts:?}; the first one:\n{}",
            first_allocation()
        );
    }
}

#[test]
fn steady_state_decode_allocates_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // accuracy_level 0 runs f32 activations; 4 the int8 kernels on weights repacked at load
    // (the default model's path).
    for accuracy_level in [0, 4] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = FixtureConfig {
            accuracy_level,
            ..FixtureConfig::default()
        };
        write_package(dir.path(), &cfg).unwrap();
        assert_no_allocations(&allocations_per_decode_step(dir.path()));
    }
}

/// An optimum export writes KV as `Concat(past, new)`; after the graph passes it decodes in
/// place like an onnxruntime-genai package.
#[test]
fn optimum_decode_allocates_nothing_after_the_passes() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    write_optimum_package(dir.path(), &FixtureConfig::default()).unwrap();
    assert_no_allocations(&allocations_per_decode_step(dir.path()));
}
