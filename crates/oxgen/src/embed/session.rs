//! The graph an [`super::Embedder`] runs, on the backend asked for, and what each run feeds
//! it: an encoder's own graph, or a decoder's cut at its final hidden states (an embedding
//! model made of a language model, as Qwen3-Embedding is).

use std::path::Path;

use oxgen_runtime::{LmContract, Session};
use oxgen_tensor::{DType, Tensor};

use super::{EmbedOptions, EmbedTokens, package_error};
use crate::backend::native_or_ort;
use crate::{Error, PackageConfig};

/// The output a decoder's graph is read from ([`oxgen_exec::NativeSession::open_hidden_states`]
/// names it so; onnxruntime-genai's builder does with `include_hidden_states`).
pub use oxgen_exec::HIDDEN_STATES;

/// A graph open for embedding, and how to feed it.
pub(super) struct Opened {
    pub session: Box<dyn Session>,
    /// Why `--backend auto` chose ONNX Runtime, when it did.
    pub note: Option<String>,
    pub feeds: Feeds,
}

/// What a run feeds besides `input_ids` and `attention_mask`.
pub(super) struct Feeds {
    /// The graph takes `token_type_ids`.
    token_types: bool,
    /// A decoder's `position_ids` input (0, 1, … for each sequence).
    positions: Option<String>,
    /// A decoder's past KV inputs, empty: every sequence runs from its first token.
    past: Vec<(String, Tensor)>,
}

impl Feeds {
    /// The inputs of one run over `tokens`, in the integer types `session` declares.
    pub fn of(&self, session: &dyn Session, tokens: &EmbedTokens) -> Vec<(String, Tensor)> {
        let n = tokens.ids.len();
        let mut feeds = vec![
            (
                "input_ids",
                tokens.ids.iter().map(|&i| i64::from(i)).collect(),
            ),
            ("attention_mask", vec![1i64; n]),
        ];
        if self.token_types {
            feeds.push((
                "token_type_ids",
                tokens.types.iter().map(|&t| i64::from(t)).collect(),
            ));
        }
        if let Some(name) = &self.positions {
            feeds.push((name.as_str(), (0..n as i64).collect()));
        }
        let mut out = Vec::with_capacity(feeds.len() + self.past.len());
        for (name, values) in feeds {
            let declared = session.inputs().iter().find(|s| s.name == name);
            let tensor = match declared.and_then(|s| s.dtype) {
                Some(DType::I32) => {
                    let narrow: Vec<i32> = values.iter().map(|&v| v as i32).collect();
                    Tensor::from_slice([1, n].as_slice(), &narrow)
                }
                _ => Tensor::from_slice([1, n].as_slice(), &values),
            }
            .expect("[1, n] holds n values");
            out.push((name.to_string(), tensor));
        }
        out.extend(self.past.iter().cloned());
        out
    }
}

fn exec_options(threads: usize) -> oxgen_exec::ExecOptions {
    // f32 activations: an embedding is compared by cosine, and int8 activations would move
    // it more than the model's own precision does.
    oxgen_exec::ExecOptions {
        threads,
        exact: true,
    }
}

/// An encoder's graph.
pub(super) fn open_encoder(
    graph: &Path,
    options: &EmbedOptions,
    threads: usize,
) -> Result<Opened, Error> {
    let (session, note) = native_or_ort(
        options.backend,
        || {
            let session = oxgen_exec::NativeSession::open(graph, &exec_options(threads))?;
            Ok(Box::new(session) as Box<dyn Session>)
        },
        || open_ort(graph, options, threads),
    )?;
    let token_types = session.inputs().iter().any(|i| i.name == "token_type_ids");
    let feeds = Feeds {
        token_types,
        positions: None,
        past: Vec::new(),
    };
    Ok(Opened {
        session,
        note,
        feeds,
    })
}

/// A decoder package's graph, put out at its final hidden states: cut there on the native
/// backend; on ONNX Runtime, which runs a graph as it is, only a graph that already puts
/// them out.
pub(super) fn open_decoder(
    dir: &Path,
    config: &PackageConfig,
    options: &EmbedOptions,
    threads: usize,
) -> Result<Opened, Error> {
    let graph = dir.join(&config.model_file);
    // The native backend cuts the graph, and reads the contract of the graph as loaded.
    let ((session, contract), note) = native_or_ort(
        options.backend,
        || {
            let exec = exec_options(threads);
            let (session, contract) =
                oxgen_exec::NativeSession::open_hidden_states(&graph, &config.kv, &exec)?;
            Ok((Box::new(session) as Box<dyn Session>, Some(contract)))
        },
        || Ok((open_ort(&graph, options, threads)?, None)),
    )?;
    let contract = match contract {
        Some(contract) => contract,
        None if session.outputs().iter().any(|o| o.name == HIDDEN_STATES) => {
            LmContract::from_io(session.inputs(), session.outputs(), &config.kv)?
        }
        None => {
            return Err(package_error(
                &graph,
                format!(
                    "puts out no {HIDDEN_STATES}, and ONNX Runtime runs a graph as it is: \
                     embed with the native backend (which cuts the graph at its output head), \
                     or export the model with its hidden states as an output \
                     (onnxruntime-genai's builder: include_hidden_states=1)"
                ),
            ));
        }
    };
    let empty = |name: &String| {
        Tensor::zeros(
            contract.kv_dtype,
            [1, contract.kv_heads, 0, contract.head_size],
        )
        .map(|t| (name.clone(), t))
    };
    let past = (contract.layers.iter())
        .flat_map(|l| [&l.past_key, &l.past_value])
        .map(empty)
        .collect::<Result<_, _>>()
        .map_err(|e| package_error(&graph, e.to_string()))?;
    let feeds = Feeds {
        token_types: false,
        positions: contract.position_ids.map(|(name, _)| name),
        past,
    };
    Ok(Opened {
        session,
        note,
        feeds,
    })
}

#[cfg(feature = "ort")]
fn open_ort(
    graph: &Path,
    options: &EmbedOptions,
    threads: usize,
) -> Result<Box<dyn Session>, Error> {
    oxgen_ort::OrtSession::open(graph, options.ort_lib.as_deref(), threads)
        .map(|s| Box::new(s) as Box<dyn Session>)
        .map_err(|e| package_error(graph, e.to_string()))
}

#[cfg(not(feature = "ort"))]
fn open_ort(_: &Path, _: &EmbedOptions, _: usize) -> Result<Box<dyn Session>, Error> {
    Err(Error::Package {
        path: "--backend ort".into(),
        reason: "this build has no ONNX Runtime backend; rebuild with the `ort` feature \
                 (the oxgen CLI enables it)"
            .into(),
    })
}
