//! Which backend runs a model: oxgen's kernels, or ONNX Runtime (with the `ort` feature).
//! Each backend opens itself; this module only picks one and says why.

use std::path::Path;

use oxgen_exec::{ExecOptions, NativeLm, NativeOptions, OpenError, Unsupported};
use oxgen_runtime::LanguageModel;

use crate::{Error, ModelOptions, PackageConfig};

/// The backend asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Backend {
    /// oxgen's own kernels.
    Native,
    /// ONNX Runtime, loaded at run time.
    Ort,
    /// Native, unless the graph needs something native lacks; then ONNX Runtime.
    #[default]
    Auto,
}

impl Backend {
    pub fn parse(s: &str) -> Option<Backend> {
        match s {
            "native" => Some(Backend::Native),
            "ort" => Some(Backend::Ort),
            "auto" => Some(Backend::Auto),
            _ => None,
        }
    }
}

/// Whether this build has the ONNX Runtime backend.
pub const HAS_ORT: bool = cfg!(feature = "ort");

/// Which backend `--backend auto` runs a graph on, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoChoice {
    /// `native`, `ort`, or `none` (native cannot, and this build has no ONNX Runtime).
    pub backend: &'static str,
    pub why: String,
    /// The graph's op types native has no kernel for, as `domain::op_type`.
    pub native_unsupported: Vec<String>,
}

impl AutoChoice {
    fn new(unsupported: Option<&Unsupported>) -> AutoChoice {
        match unsupported {
            None => AutoChoice {
                backend: "native",
                why: "the native backend loads every node".into(),
                native_unsupported: Vec::new(),
            },
            Some(u) => AutoChoice {
                backend: if HAS_ORT { "ort" } else { "none" },
                why: u.to_string(),
                native_unsupported: u.missing_ops.clone(),
            },
        }
    }
}

/// What `--backend auto` would do with the graph at `model_path` (what `oxgen inspect`
/// reports). Native is checked without building it; when native refuses the graph, ONNX
/// Runtime (`ort_lib`, else found as `--backend ort` finds it) is asked to load it, and
/// `backend` is `none`, with both reasons, when it cannot either.
pub fn auto_choice(model_path: &Path, ort_lib: Option<&Path>) -> Result<AutoChoice, Error> {
    match NativeLm::check(model_path) {
        Ok(()) => Ok(AutoChoice::new(None)),
        Err(OpenError::Unsupported { unsupported, .. }) => {
            let mut choice = AutoChoice::new(Some(&unsupported));
            if let Err(e) = ort_loads(model_path, ort_lib) {
                choice.backend = "none";
                choice.why = format!("{}; and ONNX Runtime cannot load it: {e}", choice.why);
            }
            Ok(choice)
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether ONNX Runtime creates a session for the graph (one thread, dropped at once).
#[cfg(feature = "ort")]
fn ort_loads(model_path: &Path, ort_lib: Option<&Path>) -> Result<(), String> {
    oxgen_ort::OrtSession::open(model_path, ort_lib, 1)
        .map(drop)
        .map_err(|e| e.to_string())
}

#[cfg(not(feature = "ort"))]
fn ort_loads(_: &Path, _: Option<&Path>) -> Result<(), String> {
    Err("this build has no ONNX Runtime backend".into())
}

/// How a model is opened on a backend: what was asked for, as it was asked, and what
/// `Model::open` resolved from it once.
pub(crate) struct Open<'a> {
    pub model_path: &'a Path,
    pub config: &'a PackageConfig,
    pub options: &'a ModelOptions,
    /// Kernel threads, resolved ([`oxgen_runtime::resolve_threads`]).
    pub threads: usize,
    /// The memory options asked for, resolved: `ctx_size` clamped to the context length,
    /// the prefix cache on when a disk tier is given.
    pub memory: oxgen_exec::MemoryOptions,
    /// The thread pool a native model shares with its speculative draft (`None`: one of
    /// its own, of `threads`).
    pub pool: Option<std::sync::Arc<oxgen_exec::ThreadPool>>,
    /// The prefix cache's disk tier, with the model's identity.
    pub disk: Option<oxgen_runtime::DiskTier>,
}

/// Opens the model on the backend `open.backend` asks for; the note says why `auto` chose
/// ONNX Runtime.
pub(crate) fn open(o: &Open) -> Result<(Box<dyn LanguageModel>, Option<String>), Error> {
    let (lm, note) = open_any(o)?;
    match o.memory.kv_dtype {
        Some(kv) if lm.kv_dtype() != kv => Err(Error::Package {
            path: o.model_path.display().to_string(),
            reason: match lm.backend() {
                "native" => format!(
                    "this graph's attention cannot read a paged KV cache, so its KV stays {} \
                     (its past inputs' dtype); drop --kv-dtype {kv}",
                    lm.kv_dtype()
                ),
                other => format!(
                    "the {other} backend keeps this graph's KV cache as {}; --kv-dtype {kv} \
                     needs the native backend",
                    lm.kv_dtype()
                ),
            },
        }),
        _ => Ok((lm, note)),
    }
}

fn open_any(o: &Open) -> Result<(Box<dyn LanguageModel>, Option<String>), Error> {
    native_or_ort(
        o.options.backend,
        || {
            let lm = NativeLm::open(o.model_path, &native_options(o, None))?;
            Ok(Box::new(lm) as Box<dyn LanguageModel>)
        },
        || open_ort(o),
    )
}

/// What `native` opens, unless `backend` asks for ONNX Runtime or is `auto` and the graph
/// needs what native lacks: then what `ort` opens, with a note saying why (language models
/// and encoders alike).
pub(crate) fn native_or_ort<T>(
    backend: Backend,
    native: impl FnOnce() -> Result<T, OpenError>,
    ort: impl FnOnce() -> Result<T, Error>,
) -> Result<(T, Option<String>), Error> {
    if backend == Backend::Ort {
        return Ok((ort()?, None));
    }
    match native() {
        Ok(opened) => Ok((opened, None)),
        Err(OpenError::Unsupported { unsupported, .. }) if backend == Backend::Auto && HAS_ORT => {
            let why = unsupported.to_string();
            Ok((ort()?, Some(format!("{why}; running it on ONNX Runtime"))))
        }
        Err(e) => Err(e.into()),
    }
}

fn native_options(o: &Open, layers: Option<usize>) -> NativeOptions {
    let asked = o.options;
    NativeOptions {
        exec: ExecOptions {
            threads: o.threads,
            exact: asked.exact,
        },
        kv_names: o.config.kv.clone(),
        context_length: Some(o.config.context_length),
        memory: o.memory,
        disk_cache: o.disk.clone(),
        optimize: true,
        adapters: layers.is_none() && crate::max_adapters(asked) > 0,
        layers,
        pool: Some(o.pool.clone().unwrap_or_else(|| {
            let leave_room = asked.threads == 0;
            std::sync::Arc::new(oxgen_exec::pool_of(o.threads, leave_room))
        })),
    }
}

/// The model's first `layers` layers and output head on the native backend: the draft of
/// self-speculative decoding. Its KV pool is the target's size; it holds no prefix cache.
pub(crate) fn open_layers(o: &Open, layers: usize) -> Result<Box<dyn LanguageModel>, Error> {
    let mut options = native_options(o, Some(layers));
    options.memory.prefix_cache = false;
    options.disk_cache = None;
    Ok(Box::new(NativeLm::open(o.model_path, &options)?))
}

#[cfg(feature = "ort")]
fn open_ort(o: &Open) -> Result<Box<dyn LanguageModel>, Error> {
    let options = oxgen_ort::OrtOptions {
        lib: o.options.ort_lib.clone(),
        threads: o.threads,
        kv_names: o.config.kv.clone(),
    };
    Ok(Box::new(oxgen_ort::OrtLm::open(o.model_path, &options)?))
}

#[cfg(not(feature = "ort"))]
fn open_ort(_: &Open) -> Result<Box<dyn LanguageModel>, Error> {
    Err(Error::Package {
        path: "--backend ort".into(),
        reason: "this build has no ONNX Runtime backend; rebuild with the `ort` feature \
                 (the oxgen CLI enables it)"
            .into(),
    })
}
