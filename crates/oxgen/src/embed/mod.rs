//! Sentence encoders and cross-encoders: [`Embedder`] opens an encoder package (a graph
//! taking `input_ids` and `attention_mask`, as `oxgen import` writes from a
//! sentence-transformers folder and optimum exports for `feature-extraction` or
//! `text-classification`), embeds texts or scores (query, document) pairs.
//!
//! What the package says is followed, as sentence-transformers follows it: `modules.json`
//! names the pooling folder (`1_Pooling/config.json`: CLS, mean, max or last token) and a
//! `Normalize` module (listed even when its folder is absent), `sentence_bert_config.json`
//! the `max_seq_length`. Options override each. A package without them pools by mean and
//! normalizes, as llama.cpp's embedding server does.
//!
//! Each sequence runs alone, at its own length: there is no padding to compute, and an
//! embedding's bits do not depend on what else was in the batch. A front end queues jobs for
//! the encoder's thread through [`EmbedQueue`] (`queue.rs`).

mod queue;
mod session;

pub use queue::{EmbedJob, EmbedOutput, EmbedQueue, EmbedSink, EmbedStatus, EmbedWork, serve};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use oxgen_generate::Tokenizer;
use oxgen_runtime::{OpTime, Session};
use serde_json::Value;

use crate::{Backend, Error, PackageConfig};
pub use session::HIDDEN_STATES;

/// How a sequence's token states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's state (`[CLS]`).
    Cls,
    /// The mean of every token's state.
    Mean,
    /// The largest value of each dimension over the tokens.
    Max,
    /// The last token's state (decoder-style embedding models).
    LastToken,
}

impl Pooling {
    pub const NAMES: &str = "cls, mean, max, last";

    pub fn parse(s: &str) -> Option<Pooling> {
        match s {
            "cls" => Some(Pooling::Cls),
            "mean" => Some(Pooling::Mean),
            "max" => Some(Pooling::Max),
            "last" | "lasttoken" | "last_token" => Some(Pooling::LastToken),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Cls => "cls",
            Pooling::Mean => "mean",
            Pooling::Max => "max",
            Pooling::LastToken => "last",
        }
    }

    /// `states` is `[tokens, dim]` row-major.
    fn pool(self, states: &[f32], dim: usize) -> Vec<f32> {
        let rows = states.chunks_exact(dim);
        let tokens = rows.len();
        match self {
            Pooling::Cls => states[..dim].to_vec(),
            Pooling::LastToken => states[(tokens - 1) * dim..].to_vec(),
            Pooling::Mean => {
                let mut sum = vec![0f32; dim];
                for row in rows {
                    for (s, v) in sum.iter_mut().zip(row) {
                        *s += v;
                    }
                }
                sum.iter_mut().for_each(|s| *s /= tokens as f32);
                sum
            }
            Pooling::Max => {
                let mut max = vec![f32::NEG_INFINITY; dim];
                for row in rows {
                    for (m, &v) in max.iter_mut().zip(row) {
                        *m = m.max(v);
                    }
                }
                max
            }
        }
    }
}

/// What the package computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderKind {
    /// Sentence embeddings of `dim` values.
    Embedding { pooling: Pooling, normalize: bool },
    /// A cross-encoder's relevance of a (query, document) pair: the sigmoid of one logit,
    /// or the softmax probability of the second of two labels.
    Reranker { labels: usize },
}

/// How to open an encoder package.
#[derive(Debug, Clone, Default)]
pub struct EmbedOptions {
    /// Kernel threads; 0 uses every core, fewer while other processes hold some.
    pub threads: usize,
    pub backend: Backend,
    /// ONNX Runtime's shared library (else `ORT_DYLIB_PATH`, else the Python wheel's).
    pub ort_lib: Option<PathBuf>,
    /// Pooling instead of the package's.
    pub pooling: Option<Pooling>,
    /// Normalize (or not) instead of what the package's modules say.
    pub normalize: Option<bool>,
    /// Tokens a sequence may hold instead of the package's `max_seq_length` (at most the
    /// graph's positions).
    pub max_tokens: Option<usize>,
}

/// One input to embed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbedInput {
    Text(String),
    /// Token ids as they are (special tokens are not added).
    Ids(Vec<u32>),
}

/// Why an input was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("input {index} is empty (no tokens)")]
    Empty { index: usize },
    #[error(
        "input {index} has {tokens} tokens, more than the model's {max}; shorten it or ask \
         for truncation"
    )]
    TooLong {
        index: usize,
        tokens: usize,
        max: usize,
    },
    #[error("input {index} has token id {id}, outside the vocabulary of {vocab}")]
    BadId { index: usize, id: u32, vocab: usize },
    #[error("input {index}: {reason}")]
    Tokenizer { index: usize, reason: String },
}

/// One sequence as it runs: ids and their token type ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedTokens {
    pub ids: Vec<u32>,
    pub types: Vec<u32>,
}

/// What turns a request's inputs into [`EmbedTokens`], checked: a package's tokenizer and
/// limits, cheap to clone so a server tokenizes off the thread that runs the model.
#[derive(Clone)]
pub struct EmbedTokenizer {
    tokenizer: Arc<Tokenizer>,
    max_tokens: usize,
    vocab: usize,
    /// A cross-encoder: documents are paired with the query.
    pairs: bool,
}

impl EmbedTokenizer {
    /// Tokens a sequence may hold, special tokens included.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The tokens of input `index` (special tokens added to a text; ids as they are),
    /// checked; a sequence longer than [`EmbedTokenizer::max_tokens`] is cut to it with
    /// `truncate` (keeping a closing special token, as transformers' truncation does) and
    /// refused without.
    pub fn input(
        &self,
        index: usize,
        input: &EmbedInput,
        truncate: bool,
    ) -> Result<EmbedTokens, InputError> {
        self.tokens(index, input, None, truncate)
    }

    /// The sequences a reranking runs: each (query, document) pair for a cross-encoder, else
    /// the query then each document (scored by the cosine of their embeddings).
    pub fn rerank(
        &self,
        query: &str,
        documents: &[String],
        truncate: bool,
    ) -> Result<Vec<EmbedTokens>, InputError> {
        let query_input = EmbedInput::Text(query.to_string());
        if self.pairs {
            (documents.iter().enumerate())
                .map(|(i, doc)| self.tokens(i, &query_input, Some(doc), truncate))
                .collect()
        } else {
            let query = self.tokens(0, &query_input, None, truncate)?;
            let docs = (documents.iter().enumerate())
                .map(|(i, doc)| self.tokens(i, &EmbedInput::Text(doc.clone()), None, truncate));
            std::iter::once(Ok(query)).chain(docs).collect()
        }
    }

    fn tokens(
        &self,
        index: usize,
        input: &EmbedInput,
        pair: Option<&str>,
        truncate: bool,
    ) -> Result<EmbedTokens, InputError> {
        let (mut ids, mut types) = match input {
            EmbedInput::Text(text) => {
                self.tokenizer
                    .encode_typed(text, pair)
                    .map_err(|e| InputError::Tokenizer {
                        index,
                        reason: e.to_string(),
                    })?
            }
            EmbedInput::Ids(ids) => (ids.clone(), vec![0; ids.len()]),
        };
        if ids.is_empty() {
            return Err(InputError::Empty { index });
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(InputError::BadId {
                index,
                id,
                vocab: self.vocab,
            });
        }
        if ids.len() > self.max_tokens {
            if !truncate {
                return Err(InputError::TooLong {
                    index,
                    tokens: ids.len(),
                    max: self.max_tokens,
                });
            }
            let last = *ids.last().expect("not empty");
            let last_type = *types.last().expect("as long as ids");
            ids.truncate(self.max_tokens);
            types.truncate(self.max_tokens);
            if matches!(input, EmbedInput::Text(_)) && self.tokenizer.special_token(last).is_some()
            {
                *ids.last_mut().expect("max_tokens > 0") = last;
                *types.last_mut().expect("max_tokens > 0") = last_type;
            }
        }
        Ok(EmbedTokens { ids, types })
    }
}

/// An encoder package, open.
pub struct Embedder {
    path: PathBuf,
    session: Box<dyn Session>,
    feeds: session::Feeds,
    tokenizer: EmbedTokenizer,
    kind: EncoderKind,
    /// Values per embedding (or labels of a reranker).
    dim: usize,
    /// The output read: token states, a pooled embedding (`sentence_embedding`) or a
    /// reranker's logits.
    output: &'static str,
    /// The output is already pooled.
    pooled: bool,
    threads: usize,
    note: Option<String>,
}

fn package_error(path: &Path, reason: impl Into<String>) -> Error {
    Error::Package {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn read_json(path: &Path) -> Result<Option<Value>, Error> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| package_error(path, format!("is not valid JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(package_error(path, e.to_string())),
    }
}

/// The graph file of an encoder package: `model.onnx`, else sentence-transformers' export
/// `onnx/model.onnx`.
pub fn encoder_graph(dir: &Path) -> Option<PathBuf> {
    [dir.join("model.onnx"), dir.join("onnx").join("model.onnx")]
        .into_iter()
        .find(|p| p.is_file())
}

/// `config.json` `model_type`s of encoders.
const ENCODER_TYPES: [&str; 10] = [
    "bert",
    "roberta",
    "xlm-roberta",
    "camembert",
    "distilbert",
    "mpnet",
    "electra",
    "nomic_bert",
    "modernbert",
    "deberta-v2",
];

/// Whether `dir` holds an encoder package: a graph, no `genai_config.json`, and
/// sentence-transformers' `modules.json` or an encoder's `model_type` in `config.json`. The
/// CLI and the server open such a folder with [`Embedder`] rather than as a language model.
pub fn is_encoder_package(dir: &Path) -> bool {
    if dir.join("genai_config.json").is_file() || encoder_graph(dir).is_none() {
        return false;
    }
    if dir.join("modules.json").is_file() {
        return true;
    }
    let Ok(Some(config)) = read_json(&dir.join("config.json")) else {
        return false;
    };
    config
        .get("model_type")
        .and_then(Value::as_str)
        .is_some_and(|t| ENCODER_TYPES.contains(&t))
}

/// The positions an encoder's graph holds (`max_position_embeddings` of its `config.json`,
/// less RoBERTa's offset past the padding id), when the config says.
fn encoder_positions(dir: &Path) -> Result<Option<usize>, Error> {
    let config = read_json(&dir.join("config.json"))?.unwrap_or(Value::Null);
    let positions = config
        .get("max_position_embeddings")
        .and_then(Value::as_u64)
        .map(|n| n as usize);
    let offset = match config.get("model_type").and_then(Value::as_str) {
        Some("roberta" | "xlm-roberta" | "camembert") => config
            .get("pad_token_id")
            .and_then(Value::as_u64)
            .map_or(2, |p| p as usize + 1),
        _ => 0,
    };
    Ok(positions.map(|p| p.saturating_sub(offset)))
}

/// Reads sentence-transformers' pooling and normalization from the package's modules.
fn package_pooling(dir: &Path) -> Result<Option<(Pooling, bool)>, Error> {
    let Some(modules) = read_json(&dir.join("modules.json"))? else {
        return Ok(None);
    };
    let modules = modules.as_array().cloned().unwrap_or_default();
    let of_type = |suffix: &str| {
        modules.iter().find(|m| {
            m.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with(suffix))
        })
    };
    let normalize = of_type(".Normalize").is_some();
    let Some(pooling) = of_type(".Pooling") else {
        return Ok(Some((Pooling::Mean, normalize)));
    };
    let folder = pooling.get("path").and_then(Value::as_str).unwrap_or("");
    let config_path = dir.join(folder).join("config.json");
    let config = read_json(&config_path)?.unwrap_or(Value::Null);
    let on = |key: &str| config.get(key).and_then(Value::as_bool).unwrap_or(false);
    let mode = if on("pooling_mode_cls_token") {
        Pooling::Cls
    } else if on("pooling_mode_max_tokens") {
        Pooling::Max
    } else if on("pooling_mode_lasttoken") {
        Pooling::LastToken
    } else if on("pooling_mode_mean_tokens") || config.is_null() {
        Pooling::Mean
    } else {
        return Err(package_error(
            &config_path,
            "sets no pooling mode oxgen runs (pooling_mode_cls_token, _mean_tokens, \
             _max_tokens, _lasttoken); pass --pooling to choose one",
        ));
    };
    Ok(Some((mode, normalize)))
}

impl Embedder {
    /// Opens the encoder package in `dir`, or a decoder package (`genai_config.json`, or an
    /// optimum export of a causal language model), which embeds from its final hidden
    /// states: the last token's unless the package's modules or `options` say otherwise.
    pub fn open(dir: &Path, options: &EmbedOptions) -> Result<Embedder, Error> {
        let threads = oxgen_runtime::check_threads(options.threads)
            .map_err(|reason| package_error(dir, reason))?;
        let threads = oxgen_runtime::resolve_threads(threads);
        let decoder = match is_encoder_package(dir) {
            true => None,
            false if dir.join("genai_config.json").is_file() => Some(PackageConfig::read(dir)?),
            false => PackageConfig::read(dir).ok(),
        };
        let (graph, opened, graph_max) = match &decoder {
            Some(config) => {
                let opened = session::open_decoder(dir, config, options, threads)?;
                (
                    dir.join(&config.model_file),
                    opened,
                    Some(config.context_length),
                )
            }
            None => {
                let graph = encoder_graph(dir).ok_or_else(|| {
                    package_error(
                        dir,
                        "holds no model.onnx (nor onnx/model.onnx); import a \
                         sentence-transformers folder with `oxgen import FOLDER OUT`",
                    )
                })?;
                let opened = session::open_encoder(&graph, options, threads)?;
                (graph, opened, encoder_positions(dir)?)
            }
        };
        let tokenizer = Arc::new(Tokenizer::from_file(&dir.join("tokenizer.json"))?);

        let session = &opened.session;
        let outputs: Vec<&str> = session.outputs().iter().map(|o| o.name.as_str()).collect();
        let has = |name: &str| outputs.contains(&name);
        let states = ["last_hidden_state", "token_embeddings", HIDDEN_STATES]
            .into_iter()
            .find(|name| has(name));
        let (kind, output) = if has("logits") && states.is_none() {
            (EncoderKind::Reranker { labels: 0 }, "logits")
        } else if has("sentence_embedding") || states.is_some() {
            let fallback = match decoder {
                Some(_) => (Pooling::LastToken, true),
                None => (Pooling::Mean, true),
            };
            let (pooling, normalize) = package_pooling(dir)?.unwrap_or(fallback);
            let kind = EncoderKind::Embedding {
                pooling: options.pooling.unwrap_or(pooling),
                normalize: options.normalize.unwrap_or(normalize),
            };
            match states {
                Some(states) if !has("sentence_embedding") || options.pooling.is_some() => {
                    (kind, states)
                }
                _ => (kind, "sentence_embedding"),
            }
        } else {
            return Err(package_error(
                &graph,
                format!(
                    "has outputs [{}]; an encoder puts out last_hidden_state, \
                     sentence_embedding or (a cross-encoder) logits",
                    outputs.join(", ")
                ),
            ));
        };
        let package_max = read_json(&dir.join("sentence_bert_config.json"))?
            .and_then(|c| c.get("max_seq_length")?.as_u64())
            .map(|n| n as usize);
        let max_tokens = match (options.max_tokens, package_max, graph_max) {
            (Some(asked), _, Some(graph)) if asked > graph => {
                return Err(package_error(
                    dir,
                    format!(
                        "--max-tokens {asked} is more than the model's {graph} positions; \
                         choose at most {graph}"
                    ),
                ));
            }
            (Some(asked), _, _) => asked,
            (None, Some(package), graph) => graph.map_or(package, |g| package.min(g)),
            (None, None, Some(graph)) => graph,
            (None, None, None) => 512,
        };
        let tokenizer = EmbedTokenizer {
            vocab: tokenizer.vocab_size(),
            tokenizer,
            max_tokens,
            pairs: matches!(kind, EncoderKind::Reranker { .. }),
        };
        let mut embedder = Embedder {
            path: dir.to_path_buf(),
            session: opened.session,
            feeds: opened.feeds,
            tokenizer,
            kind,
            dim: 0,
            output,
            pooled: output == "sentence_embedding",
            threads,
            note: opened.note,
        };
        // One run of a short input tells the width (and a reranker's labels), and checks
        // the graph runs at all.
        let probe = embedder.run(&EmbedTokens {
            ids: vec![0, 0],
            types: vec![0, 0],
        })?;
        embedder.dim = probe.len();
        if let EncoderKind::Reranker { labels } = &mut embedder.kind {
            *labels = probe.len();
            if !(1..=2).contains(labels) {
                return Err(package_error(
                    &graph,
                    format!(
                        "puts out {labels} logits; a reranker has one (a relevance logit) or \
                         two (irrelevant, relevant)"
                    ),
                ));
            }
        }
        Ok(embedder)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn kind(&self) -> EncoderKind {
        self.kind
    }

    /// Values per embedding (a reranker's: its labels).
    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn backend(&self) -> &'static str {
        self.session.backend()
    }

    /// Kernel threads, resolved.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Times every op type of the native backend from now on (a little slower); read them
    /// with [`Embedder::op_times`].
    pub fn set_profiling(&mut self, on: bool) {
        self.session.set_profiling(on);
    }

    /// Time per op type since profiling was switched on, most expensive first (none on
    /// ONNX Runtime).
    pub fn op_times(&self) -> Vec<OpTime> {
        self.session.op_times()
    }

    /// Why `--backend auto` chose ONNX Runtime, when it did.
    pub fn backend_note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    pub fn tokenizer(&self) -> &EmbedTokenizer {
        &self.tokenizer
    }

    fn refused(&self, e: InputError) -> Error {
        package_error(&self.path, e.to_string())
    }

    /// The embedding of each input, in order.
    pub fn embed(&mut self, inputs: &[EmbedInput], truncate: bool) -> Result<Vec<Vec<f32>>, Error> {
        let tokens = (inputs.iter().enumerate())
            .map(|(i, input)| self.tokenizer.input(i, input, truncate))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.refused(e))?;
        self.embed_tokens(&tokens)
    }

    /// The embedding of each tokenized input, in order.
    pub fn embed_tokens(&mut self, tokens: &[EmbedTokens]) -> Result<Vec<Vec<f32>>, Error> {
        let EncoderKind::Embedding { .. } = self.kind else {
            return Err(package_error(
                &self.path,
                "is a reranker (a cross-encoder): it scores (query, document) pairs and \
                 embeds nothing; use rerank",
            ));
        };
        tokens.iter().map(|t| self.run(t)).collect()
    }

    /// The relevance of each document to `query`, in the documents' order: a
    /// cross-encoder's score of each pair, or the cosine of an embedding model's two
    /// embeddings.
    pub fn rerank(
        &mut self,
        query: &str,
        documents: &[String],
        truncate: bool,
    ) -> Result<Vec<f32>, Error> {
        let tokens =
            (self.tokenizer.rerank(query, documents, truncate)).map_err(|e| self.refused(e))?;
        self.rerank_tokens(&tokens)
    }

    /// [`Embedder::rerank`] of sequences [`EmbedTokenizer::rerank`] made.
    pub fn rerank_tokens(&mut self, tokens: &[EmbedTokens]) -> Result<Vec<f32>, Error> {
        match self.kind {
            EncoderKind::Reranker { labels } => tokens
                .iter()
                .map(|t| self.run(t).map(|logits| relevance(&logits, labels)))
                .collect(),
            EncoderKind::Embedding { .. } => {
                let vectors = self.embed_tokens(tokens)?;
                let (query, docs) = vectors
                    .split_first()
                    .ok_or_else(|| package_error(&self.path, "a reranking needs a query"))?;
                Ok(docs.iter().map(|d| cosine(query, d)).collect())
            }
        }
    }

    /// Runs one sequence: its pooled (and normalized) embedding, or a reranker's logits.
    fn run(&mut self, tokens: &EmbedTokens) -> Result<Vec<f32>, Error> {
        let n = tokens.ids.len();
        let feeds = self.feeds.of(self.session.as_ref(), tokens);
        let outputs = self.session.run(feeds)?;
        let (_, out) = outputs
            .iter()
            .find(|(name, _)| name == self.output)
            .ok_or_else(|| {
                package_error(&self.path, format!("the graph put out no {}", self.output))
            })?;
        let values = out.as_slice::<f32>().map_err(|_| {
            package_error(
                &self.path,
                format!("{} is {}, not f32", self.output, out.dtype().name()),
            )
        })?;
        match self.kind {
            EncoderKind::Reranker { .. } => Ok(values.to_vec()),
            EncoderKind::Embedding { pooling, normalize } => {
                let mut v = if self.pooled {
                    values.to_vec()
                } else {
                    let dim = *out.dims().last().unwrap_or(&0);
                    if dim == 0 || values.len() != n * dim {
                        return Err(package_error(
                            &self.path,
                            format!(
                                "{} has shape {:?}, not [1, {n}, dim]",
                                self.output,
                                out.dims()
                            ),
                        ));
                    }
                    pooling.pool(values, dim)
                };
                if normalize {
                    normalize_in_place(&mut v);
                }
                Ok(v)
            }
        }
    }
}

/// Scales `v` to unit length (a zero vector stays zero), as torch's `F.normalize` does.
pub fn normalize_in_place(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    dot / (norm(a) * norm(b))
}

/// A cross-encoder's relevance from its logits: sigmoid of one, softmax of the second of two.
fn relevance(logits: &[f32], labels: usize) -> f32 {
    match labels {
        1 => 1.0 / (1.0 + (-logits[0]).exp()),
        _ => {
            let m = logits[0].max(logits[1]);
            let (a, b) = ((logits[0] - m).exp(), (logits[1] - m).exp());
            b / (a + b)
        }
    }
}
