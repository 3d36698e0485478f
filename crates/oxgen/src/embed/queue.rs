//! The encoder's thread and the way into it: jobs (embed, or score pairs) queued by front
//! ends, run a turn at a time, every job waiting in one turn.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};

use super::{EmbedTokens, Embedder};

/// What an encoder job asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbedWork {
    /// Embeddings of these sequences.
    Embed(Vec<EmbedTokens>),
    /// Relevances of the sequences [`EmbedTokenizer::rerank`] made.
    Rerank(Vec<EmbedTokens>),
}

impl EmbedWork {
    fn sequences(&self) -> &[EmbedTokens] {
        match self {
            EmbedWork::Embed(t) | EmbedWork::Rerank(t) => t,
        }
    }
}

/// What an encoder job gives back.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbedOutput {
    Embeddings(Vec<Vec<f32>>),
    Scores(Vec<f32>),
}

/// Where a job's result goes (a server's reply channel).
pub trait EmbedSink: Send {
    /// The requester went away: the job is skipped.
    fn is_closed(&self) -> bool;
    fn send(self: Box<Self>, result: Result<EmbedOutput, String>);
}

/// One request for the encoder's thread.
pub struct EmbedJob {
    pub work: EmbedWork,
    pub sink: Box<dyn EmbedSink>,
}

/// What the encoder's thread reports: jobs waiting and running, sequences and tokens
/// embedded; what metrics, health and a drain read.
#[derive(Debug, Default)]
pub struct EmbedStatus {
    queued: AtomicUsize,
    running: AtomicUsize,
    sequences: AtomicU64,
    tokens: AtomicU64,
}

impl EmbedStatus {
    pub fn queued(&self) -> usize {
        self.queued.load(Relaxed)
    }

    pub fn running(&self) -> usize {
        self.running.load(Relaxed)
    }

    /// Jobs queued or running.
    pub fn live(&self) -> usize {
        self.queued() + self.running()
    }

    /// Sequences run (embedded, or pairs scored).
    pub fn sequences(&self) -> u64 {
        self.sequences.load(Relaxed)
    }

    /// Tokens of the sequences run.
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Relaxed)
    }
}

/// The way into the encoder's thread: refuses past `max_queue` jobs waiting.
#[derive(Clone)]
pub struct EmbedQueue {
    jobs: Sender<EmbedJob>,
    status: Arc<EmbedStatus>,
    max_queue: usize,
}

impl EmbedQueue {
    pub fn new(jobs: Sender<EmbedJob>, status: Arc<EmbedStatus>, max_queue: usize) -> EmbedQueue {
        EmbedQueue {
            jobs,
            status,
            max_queue,
        }
    }

    /// Queues `job`; gives it back when the queue is full or the thread has stopped.
    pub fn submit(&self, job: EmbedJob) -> Result<(), EmbedJob> {
        if self.status.queued() >= self.max_queue {
            return Err(job);
        }
        self.status.queued.fetch_add(1, Relaxed);
        self.jobs.send(job).map_err(|e| {
            self.status.queued.fetch_sub(1, Relaxed);
            e.0
        })
    }
}

/// Runs jobs from `jobs` until every sender is gone or `stop` says so. Each turn takes every
/// job waiting (so concurrent clients' requests run together, in arrival order, each
/// sequence at its own length); a job whose sink closed is skipped. Once stopped, what is
/// still queued is answered with an error.
pub fn serve(
    embedder: &mut Embedder,
    jobs: &Receiver<EmbedJob>,
    status: &EmbedStatus,
    stop: &dyn Fn() -> bool,
) {
    let wait = std::time::Duration::from_millis(50);
    while !stop() {
        let first = match jobs.recv_timeout(wait) {
            Ok(job) => job,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let turn: Vec<EmbedJob> = std::iter::once(first).chain(jobs.try_iter()).collect();
        status.queued.fetch_sub(turn.len(), Relaxed);
        status.running.fetch_add(turn.len(), Relaxed);
        for job in turn {
            if !job.sink.is_closed() {
                let result = match &job.work {
                    EmbedWork::Embed(t) => embedder.embed_tokens(t).map(EmbedOutput::Embeddings),
                    EmbedWork::Rerank(t) => embedder.rerank_tokens(t).map(EmbedOutput::Scores),
                };
                let sequences = job.work.sequences();
                status.sequences.fetch_add(sequences.len() as u64, Relaxed);
                let tokens: usize = sequences.iter().map(|s| s.ids.len()).sum();
                status.tokens.fetch_add(tokens as u64, Relaxed);
                job.sink.send(result.map_err(|e| e.to_string()));
            }
            status.running.fetch_sub(1, Relaxed);
        }
    }
    for job in jobs.try_iter() {
        status.queued.fetch_sub(1, Relaxed);
        job.sink.send(Err("the server is shutting down".into()));
    }
}
