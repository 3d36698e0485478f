//! `oxgen embed MODEL [TEXT...]`: embeddings of each text (or of each line of stdin) as JSON
//! lines, from an encoder package (`oxgen import` of a sentence-transformers folder) or a
//! decoder package (from its final hidden states); with
//! `--rerank QUERY`, each text's relevance to QUERY instead.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Context;
use oxgen::{EmbedInput, EmbedOptions, Embedder, Pooling};

use crate::options::{BackendArgs, Usage};

/// How an encoder package is opened (shared with `oxgen serve`).
#[derive(clap::Args, Debug, Clone)]
pub struct EncoderArgs {
    /// Pooling instead of the package's (cls, mean, max, last).
    #[arg(long, env = "OXGEN_POOLING", value_parser = pooling)]
    pub pooling: Option<Pooling>,
    /// Normalize embeddings to unit length (true/false) instead of what the package's
    /// modules.json says.
    #[arg(long, env = "OXGEN_NORMALIZE")]
    pub normalize: Option<bool>,
    /// Tokens a sequence may hold instead of the package's max_seq_length.
    #[arg(long, env = "OXGEN_MAX_TOKENS")]
    pub max_tokens: Option<usize>,
}

fn pooling(s: &str) -> Result<Pooling, String> {
    Pooling::parse(s).ok_or_else(|| format!("'{s}' is not one of {}", Pooling::NAMES))
}

impl EncoderArgs {
    pub fn options(&self, threads: usize, backend: &BackendArgs) -> EmbedOptions {
        EmbedOptions {
            threads,
            backend: backend.backend(),
            ort_lib: backend.ort_lib.clone(),
            pooling: self.pooling,
            normalize: self.normalize,
            max_tokens: self.max_tokens,
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// The encoder package folder, or a decoder package's (it embeds from its final hidden
    /// states, last-token pooled unless --pooling says otherwise).
    model: PathBuf,
    /// Texts to embed; without any, each line of stdin is one.
    texts: Vec<String>,
    /// Score each text as a document against this query (a cross-encoder's relevance, or
    /// an embedding model's cosine) instead of printing embeddings.
    #[arg(long, env = "OXGEN_RERANK")]
    rerank: Option<String>,
    /// Cut inputs longer than the model takes instead of failing.
    #[arg(long, env = "OXGEN_TRUNCATE")]
    truncate: bool,
    /// Kernel threads (0: every core, fewer while other processes hold some).
    #[arg(long, env = "OXGEN_THREADS", default_value_t = 0, value_parser = crate::options::threads)]
    threads: usize,
    /// Print the time per op type (native backend) and the sequences per second to stderr.
    #[arg(long, env = "OXGEN_PROFILE")]
    profile: bool,
    #[command(flatten)]
    encoder: EncoderArgs,
    #[command(flatten)]
    backend: BackendArgs,
}

/// One output line (f32 values written at their shortest).
#[derive(serde::Serialize)]
struct Line<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    embedding: Option<&'a [f32]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    relevance_score: Option<f32>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let texts = if args.texts.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<Vec<_>, _>>()
            .context("reading texts from stdin")?
    } else {
        args.texts.clone()
    };
    if texts.is_empty() {
        return Err(Usage("no texts: give them as arguments or as lines on stdin".into()).into());
    }
    let options = args.encoder.options(args.threads, &args.backend);
    let mut embedder = Embedder::open(&args.model, &options)
        .with_context(|| format!("opening {}", args.model.display()))?;
    if let Some(note) = embedder.backend_note() {
        eprintln!("note: {note}");
    }
    embedder.set_profiling(args.profile);
    let (count, started) = (texts.len(), std::time::Instant::now());
    let mut out = std::io::stdout().lock();
    match &args.rerank {
        Some(query) => {
            let scores = embedder.rerank(query, &texts, args.truncate)?;
            for (index, score) in scores.iter().enumerate() {
                let line = Line {
                    index,
                    relevance_score: Some(*score),
                    embedding: None,
                };
                writeln!(out, "{}", serde_json::to_string(&line)?)?;
            }
        }
        None => {
            let inputs: Vec<EmbedInput> = texts.into_iter().map(EmbedInput::Text).collect();
            let vectors = embedder.embed(&inputs, args.truncate)?;
            for (index, embedding) in vectors.iter().enumerate() {
                let line = Line {
                    index,
                    relevance_score: None,
                    embedding: Some(embedding.as_slice()),
                };
                writeln!(out, "{}", serde_json::to_string(&line)?)?;
            }
        }
    }
    if args.profile {
        let seconds = started.elapsed().as_secs_f64();
        eprintln!(
            "{count} sequences in {seconds:.2} s ({:.1} per second), {} backend, {} threads",
            count as f64 / seconds,
            embedder.backend(),
            embedder.threads()
        );
        crate::profile::print_op_times(&embedder.op_times());
    }
    Ok(())
}
