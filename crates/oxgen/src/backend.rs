//! Which backend runs a model: oxgen's kernels, or ONNX Runtime (with the `ort` feature).

use std::path::Path;

use oxgen_exec::{DEFAULT_KV_BLOCKS, ExecOptions, KV_BLOCK_SIZE, KvConfig, NativeLm, OpTime};
use oxgen_runtime::{
    Batch, Capabilities, KvUsage, LanguageModel, LmContract, RuntimeError, SeqId, StepCounters,
    StepLogits,
};

use crate::{Error, KvBudget, PackageConfig};

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

/// A language model on the backend that was picked (one per `Model`, so the variants' sizes
/// do not matter).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Lm {
    Native(NativeLm),
    #[cfg(feature = "ort")]
    Ort(oxgen_ort::OrtLm),
}

impl Lm {
    pub fn name(&self) -> &'static str {
        match self {
            Lm::Native(_) => "native",
            #[cfg(feature = "ort")]
            Lm::Ort(_) => "ort",
        }
    }

    /// Per-op timing (native only).
    pub fn set_profiling(&mut self, on: bool) {
        match self {
            Lm::Native(lm) => lm.set_profiling(on),
            #[cfg(feature = "ort")]
            Lm::Ort(_) => {}
        }
    }

    pub fn op_times(&self) -> Vec<OpTime> {
        match self {
            Lm::Native(lm) => lm.op_times(),
            #[cfg(feature = "ort")]
            Lm::Ort(_) => Vec::new(),
        }
    }

    pub fn sequence_count(&self) -> usize {
        match self {
            Lm::Native(lm) => lm.sequence_count(),
            #[cfg(feature = "ort")]
            Lm::Ort(lm) => lm.sequence_count(),
        }
    }

    fn inner(&mut self) -> &mut dyn LanguageModel {
        match self {
            Lm::Native(lm) => lm,
            #[cfg(feature = "ort")]
            Lm::Ort(lm) => lm,
        }
    }

    fn inner_ref(&self) -> &dyn LanguageModel {
        match self {
            Lm::Native(lm) => lm,
            #[cfg(feature = "ort")]
            Lm::Ort(lm) => lm,
        }
    }
}

impl LanguageModel for Lm {
    fn contract(&self) -> &LmContract {
        self.inner_ref().contract()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner_ref().capabilities()
    }

    fn add_sequence(&mut self, max_context: usize) -> Result<SeqId, RuntimeError> {
        self.inner().add_sequence(max_context)
    }

    fn remove_sequence(&mut self, seq: SeqId) {
        self.inner().remove_sequence(seq);
    }

    fn sequence_len(&self, seq: SeqId) -> Option<usize> {
        self.inner_ref().sequence_len(seq)
    }

    fn step(&mut self, batch: &Batch, out: &mut StepLogits) -> Result<(), RuntimeError> {
        self.inner().step(batch, out)
    }

    fn start_sequence(
        &mut self,
        max_context: usize,
        prompt: &[u32],
    ) -> Result<(SeqId, usize), RuntimeError> {
        self.inner().start_sequence(max_context, prompt)
    }

    fn kv_usage(&self) -> Option<KvUsage> {
        self.inner_ref().kv_usage()
    }

    fn counters(&self) -> StepCounters {
        self.inner_ref().counters()
    }
}

/// What native cannot run in this graph: op types it has no kernel for.
pub fn native_unsupported(model: &oxgen_onnx::Model) -> Vec<String> {
    let registry = oxgen_graph::Registry::default();
    let mut missing = std::collections::BTreeSet::new();
    for node in &model.graph().node {
        if !registry.knows(node.domain(), node.op_type()) {
            let domain = if node.domain().is_empty() {
                "ai.onnx"
            } else {
                node.domain()
            };
            missing.insert(format!("{domain}::{}", node.op_type()));
        }
    }
    missing.into_iter().collect()
}

/// How a model is opened on a backend.
pub(crate) struct Open<'a> {
    pub model_path: &'a Path,
    pub config: &'a PackageConfig,
    pub threads: usize,
    pub exact: bool,
    pub backend: Backend,
    #[cfg_attr(not(feature = "ort"), allow(dead_code))]
    pub ort_lib: Option<&'a Path>,
    pub kv: KvBudget,
    pub prefix_cache: bool,
}

/// Opens the model on the backend `open.backend` asks for; the note says why `auto` chose
/// ONNX Runtime.
pub(crate) fn open(o: &Open) -> Result<(Lm, Option<String>), Error> {
    let shown = o.model_path.display().to_string();
    let onnx = oxgen_onnx::Model::load(o.model_path).map_err(|e| Error::Onnx {
        path: shown.clone(),
        source: Box::new(e),
    })?;
    if o.backend == Backend::Ort {
        return Ok((open_ort(o, &onnx)?, None));
    }
    let native = oxgen_graph::Graph::from_model(&onnx).map_err(|e| Error::Graph {
        path: shown.clone(),
        source: Box::new(e),
    });
    let graph = match native {
        Ok(graph) => graph,
        Err(e) if o.backend == Backend::Auto && HAS_ORT => {
            let missing = native_unsupported(&onnx);
            let why = if missing.is_empty() {
                format!("the native backend cannot load it ({e})")
            } else {
                format!(
                    "the native backend has no kernel for {}",
                    missing.join(", ")
                )
            };
            return Ok((
                open_ort(o, &onnx)?,
                Some(format!("{why}; running it on ONNX Runtime")),
            ));
        }
        Err(e) => return Err(e),
    };
    // The graph passes size rotary caches to the package's context.
    let passes = oxgen_graph::passes::Options {
        max_positions: Some(o.config.context_length),
        ..Default::default()
    };
    let mut lm = NativeLm::with_passes(
        graph,
        &ExecOptions {
            threads: o.threads,
            exact: o.exact,
        },
        &o.config.kv,
        &passes,
    )?;
    let whole_context = o.config.context_length.div_ceil(KV_BLOCK_SIZE);
    let blocks = match o.kv {
        KvBudget::Sequences(n) => DEFAULT_KV_BLOCKS.max(n.saturating_mul(whole_context)),
        KvBudget::Blocks(n) => n,
        KvBudget::Bytes(b) => (b / lm.kv_block_bytes().max(1)).max(1),
    };
    lm.configure_kv(&KvConfig {
        blocks,
        block_size: KV_BLOCK_SIZE,
        prefix_cache: o.prefix_cache,
    })?;
    Ok((Lm::Native(lm), None))
}

/// Whether every past-KV input is read only by `GroupQueryAttention` nodes, which may share
/// one context-sized buffer between past and present (the rule native applies to its own
/// graph after its passes; ONNX Runtime runs the graph as written).
#[cfg(feature = "ort")]
fn shared_kv(onnx: &oxgen_onnx::Model, kv: &oxgen_runtime::KvTemplates) -> bool {
    let g = onnx.graph();
    let only_gqa = |name: &str| {
        let mut readers = g
            .node
            .iter()
            .filter(|n| n.input.iter().any(|i| i == name))
            .peekable();
        readers.peek().is_some() && readers.all(|n| n.op_type() == "GroupQueryAttention")
    };
    let mut layers = 0;
    loop {
        let key = kv.past_key.replace("%d", &layers.to_string());
        if !g.input.iter().any(|i| i.name() == key) {
            return layers > 0;
        }
        let value = kv.past_value.replace("%d", &layers.to_string());
        if !only_gqa(&key) || !only_gqa(&value) {
            return false;
        }
        layers += 1;
    }
}

#[cfg(feature = "ort")]
fn open_ort(o: &Open, onnx: &oxgen_onnx::Model) -> Result<Lm, Error> {
    let shared = shared_kv(onnx, &o.config.kv);
    let lm = oxgen_ort::OrtLm::open(o.model_path, o.ort_lib, o.threads, &o.config.kv, shared)?;
    Ok(Lm::Ort(lm))
}

#[cfg(not(feature = "ort"))]
fn open_ort(_: &Open, _: &oxgen_onnx::Model) -> Result<Lm, Error> {
    Err(Error::Package {
        path: "--backend ort".into(),
        reason: "this build has no ONNX Runtime backend; rebuild with the `ort` feature \
                 (the oxgen CLI enables it)"
            .into(),
    })
}
