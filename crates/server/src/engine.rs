//! The scheduler loop: one thread owns the model; requests arrive through a channel, each
//! with its own sender for what it produces. Every turn admits queued requests into the
//! running set (up to `--max-batch` sequences, and only when the KV pool can reserve their
//! blocks; otherwise they wait), then runs **one step over every running sequence**: decode
//! tokens and prompt chunks of at most `--prefill-chunk` ids together, in one forward where
//! the backend fuses batches (native on paged graphs). Requests join and leave at token
//! boundaries, and a long prompt is prefilled a chunk per turn while the others keep
//! decoding. A request whose receiver is gone (the client disconnected) is cancelled at the
//! next turn and its KV freed.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use oxgen::{GenerateOptions, KvUsage, Model, Sequence, Step};

use tokio::sync::mpsc::UnboundedSender;

use crate::error::ApiError;
use crate::metrics::{EngineStats, Metrics};

/// A request for the engine: `n` generations of one prompt.
pub struct Job {
    pub ids: Vec<u32>,
    pub options: GenerateOptions,
    pub n: usize,
    /// KV positions each sequence holds (prompt plus new tokens, as the model sizes them).
    pub positions: usize,
    pub top_logprobs: Option<usize>,
    pub arrived: Instant,
    pub deadline: Option<Instant>,
    pub events: UnboundedSender<Event>,
}

/// What a request produces, in order: tokens (each choice's last one carries its finish
/// reason), then `Done`; or an `Error` at any point, after which nothing follows.
#[derive(Debug)]
pub enum Event {
    Token {
        choice: usize,
        step: Step,
    },
    Done {
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    Error(ApiError),
}

/// A request in the running set.
struct Running {
    job: Job,
    /// One per choice; `None` once it finished and its KV was freed.
    seqs: Vec<Option<Sequence>>,
    last_token: Vec<Option<Instant>>,
    completion_tokens: usize,
    done: bool,
}

impl Running {
    fn live(&self) -> usize {
        self.seqs.iter().flatten().count()
    }

    /// Frees every sequence still held.
    fn end(&mut self, model: &mut Model) {
        for s in self.seqs.iter_mut().filter_map(Option::take) {
            model.end(s);
        }
        self.done = true;
    }

    fn fail(&mut self, model: &mut Model, error: ApiError) {
        let _ = self.job.events.send(Event::Error(error));
        self.end(model);
    }

    /// Ends the request if its client left or its time ran out; true if it is still on.
    fn check(&mut self, model: &mut Model, timeout: Option<Duration>) -> bool {
        if self.job.events.is_closed() {
            self.end(model);
        } else if self.job.deadline.is_some_and(|d| Instant::now() >= d) {
            self.fail(model, timed_out(timeout));
        }
        !self.done
    }

    /// What one step gave choice `choice`: tokens (several when speculative decoding
    /// confirmed proposals), nothing yet (a prompt chunk), or an error that fails the request.
    fn on_step(
        &mut self,
        choice: usize,
        result: Result<Vec<Step>, oxgen::Error>,
        model: &mut Model,
        metrics: &Metrics,
    ) {
        match result {
            Ok(steps) => {
                for step in steps {
                    self.on_token(choice, step, model, metrics);
                }
            }
            Err(e) if !self.done => {
                self.fail(model, ApiError::internal(format!("generation failed: {e}")));
            }
            Err(_) => {}
        }
    }

    fn on_token(&mut self, choice: usize, step: Step, model: &mut Model, metrics: &Metrics) {
        if self.done {
            return;
        }
        let now = Instant::now();
        match self.last_token[choice].replace(now) {
            Some(last) => metrics.inter_token.observe(now - last),
            None if choice == 0 => metrics.ttft.observe(now - self.job.arrived),
            None => {}
        }
        metrics.generated_tokens.fetch_add(1, Relaxed);
        self.completion_tokens += 1;
        if step.finish.is_some()
            && let Some(s) = self.seqs[choice].take()
        {
            model.end(s);
        }
        let _ = self.job.events.send(Event::Token { choice, step });
        if self.live() == 0 {
            let _ = self.job.events.send(Event::Done {
                prompt_tokens: self.job.ids.len(),
                completion_tokens: self.completion_tokens,
            });
            self.done = true;
        }
    }
}

/// One step over every running sequence (see the module doc); returns how many ran.
fn step_all(
    running: &mut [Running],
    model: &mut Model,
    metrics: &Metrics,
    limits: &Limits,
) -> usize {
    let mut owners = Vec::new();
    let mut seqs: Vec<&mut Sequence> = Vec::new();
    for (r, request) in running.iter_mut().enumerate() {
        if !request.check(model, limits.request_timeout) {
            continue;
        }
        for (choice, slot) in request.seqs.iter_mut().enumerate() {
            if let Some(s) = slot {
                owners.push((r, choice));
                seqs.push(s);
            }
        }
    }
    if seqs.is_empty() {
        return 0;
    }
    let results = model.advance_batch(&mut seqs, limits.prefill_chunk);
    drop(seqs);
    let ran = owners.len();
    for ((r, choice), result) in owners.into_iter().zip(results) {
        running[r].on_step(choice, result, model, metrics);
    }
    ran
}

fn timed_out(timeout: Option<Duration>) -> ApiError {
    let secs = timeout.map_or(0, |t| t.as_secs());
    ApiError::unavailable(
        "timeout",
        format!("the request took longer than {secs} s (--request-timeout)"),
    )
}

/// Starts every choice of `job`; on failure (the KV could not be allocated) the job gets a
/// 500 and nothing is held. The request was validated before it was queued, so a failure here
/// is the server's.
fn admit(model: &mut Model, job: Job, metrics: &Metrics) -> Option<Running> {
    let mut seqs = Vec::with_capacity(job.n);
    for choice in 0..job.n {
        let mut options = job.options.clone();
        options.sampling.seed = options.sampling.seed.wrapping_add(choice as u64);
        match model.start(&job.ids, &options, job.top_logprobs) {
            Ok(s) => seqs.push(Some(s)),
            Err(e) => {
                for s in seqs.into_iter().flatten() {
                    model.end(s);
                }
                let _ = job.events.send(Event::Error(ApiError::internal(format!(
                    "starting the generation failed: {e}"
                ))));
                return None;
            }
        }
    }
    metrics
        .prompt_tokens
        .fetch_add(job.ids.len() as u64, Relaxed);
    Some(Running {
        last_token: vec![None; job.n],
        seqs,
        job,
        completion_tokens: 0,
        done: false,
    })
}

/// How the loop runs.
pub struct Limits {
    /// Sequences stepped per turn at most (a request with `n` choices counts `n`).
    pub max_batch: usize,
    /// Prompt ids a sequence feeds per step at most.
    pub prefill_chunk: usize,
    pub request_timeout: Option<Duration>,
}

/// Whether `job` can start now: a free slot in the running set and KV blocks to reserve.
/// `Err` when it can never run (it needs more blocks than the whole pool has).
fn fits(job: &Job, busy: usize, model: &Model, limits: &Limits) -> Result<bool, ApiError> {
    if busy > 0 && busy + job.n > limits.max_batch {
        return Ok(false);
    }
    let Some(kv) = model.kv_usage() else {
        return Ok(true);
    };
    Ok(kv_need(job.n, job.positions, &kv)? <= kv.available())
}

/// The KV blocks `n` sequences of `positions` reserve; 503 `kv_cache_full` when that is more
/// than the whole pool holds, so the request could never run. The server asks on arrival
/// (the pool's size is fixed), before a request waits in the queue.
pub(crate) fn kv_need(n: usize, positions: usize, kv: &KvUsage) -> Result<usize, ApiError> {
    let need = n * kv.blocks_for(positions);
    if need > kv.total {
        return Err(ApiError::unavailable(
            "kv_cache_full",
            format!(
                "the request needs {need} KV blocks ({n} sequences of {positions} positions) and \
                 the pool has {}; lower max_tokens or n, or raise --kv-blocks",
                kv.total
            ),
        ));
    }
    Ok(need)
}

/// Updates what `/metrics` and `/health` report of the model after a step of `batch`
/// sequences.
pub(crate) fn publish(model: &Model, metrics: &Metrics, batch: usize) {
    metrics.kv_sequences.store(model.live_sequences(), Relaxed);
    *metrics.engine.lock().unwrap_or_else(|e| e.into_inner()) = EngineStats {
        kv: model.kv_usage(),
        counters: model.counters(),
        batch,
        speculation: model.speculation().map(|(_, stats)| stats),
    };
}

/// Runs requests from `jobs` until every sender is gone or `stop` returns true; then fails
/// whatever is left with a 503.
pub fn run(
    model: &mut Model,
    jobs: &Receiver<Job>,
    limits: &Limits,
    metrics: &Metrics,
    stop: &dyn Fn() -> bool,
) {
    let mut pending: VecDeque<Job> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    let mut batch = 0;
    loop {
        if stop() {
            break;
        }
        if running.is_empty() && pending.is_empty() {
            // Idle: wait for work, waking now and then to see `stop`.
            match jobs.recv_timeout(Duration::from_millis(100)) {
                Ok(job) => pending.push_back(job),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        pending.extend(jobs.try_iter());
        // Drop queued requests whose client left or whose time ran out.
        let now = Instant::now();
        pending.retain(|job| {
            let expired = job.deadline.is_some_and(|d| now >= d);
            if expired {
                let _ = job
                    .events
                    .send(Event::Error(timed_out(limits.request_timeout)));
            }
            let keep = !expired && !job.events.is_closed();
            if !keep {
                metrics.queued.fetch_sub(1, Relaxed);
            }
            keep
        });
        let mut admitted = false;
        while let Some(job) = pending.front() {
            let busy: usize = running.iter().map(Running::live).sum();
            match fits(job, busy, model, limits) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    let job = pending.pop_front().expect("front exists");
                    let _ = job.events.send(Event::Error(e));
                    metrics.queued.fetch_sub(1, Relaxed);
                    continue;
                }
            }
            let job = pending.pop_front().expect("front exists");
            // Counted as running before it stops counting as queued, so `Metrics::live`
            // never reads 0 while a request is being admitted (a drain would take that for
            // idle and abort it).
            metrics.running.fetch_add(1, Relaxed);
            metrics.queued.fetch_sub(1, Release);
            match admit(model, job, metrics) {
                Some(r) => {
                    running.push(r);
                    admitted = true;
                }
                None => {
                    metrics.running.fetch_sub(1, Relaxed);
                }
            }
        }
        if admitted {
            // The new reservations show before the step (a long prefill) that follows.
            publish(model, metrics, batch);
        }
        batch = step_all(&mut running, model, metrics, limits);
        running.retain(|r| {
            if r.done {
                metrics.running.fetch_sub(1, Relaxed);
            }
            !r.done
        });
        publish(model, metrics, batch);
    }
    let stopping = || ApiError::unavailable("shutting_down", "the server is shutting down");
    for mut r in running {
        r.fail(model, stopping());
        metrics.running.fetch_sub(1, Relaxed);
    }
    for job in pending.into_iter().chain(jobs.try_iter()) {
        let _ = job.events.send(Event::Error(stopping()));
        metrics.queued.fetch_sub(1, Relaxed);
    }
    metrics.kv_sequences.store(model.live_sequences(), Relaxed);
}
