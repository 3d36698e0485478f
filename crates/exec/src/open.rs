//! How the native backend opens a language model: its options ([`NativeOptions`], the KV
//! pool's size [`KvBudget`]), why opening fails ([`OpenError`], [`Unsupported`]), and the
//! steps on the graph before [`crate::NativeLm`] is built from it (loading, cutting to the
//! first layers).

use std::path::Path;

use oxgen_graph::{Graph, ValueId};
use oxgen_runtime::{IoSpec, KvDtype, KvTemplates, LmContract, RuntimeError};

use crate::ExecOptions;

/// Positions per KV block.
pub const KV_BLOCK_SIZE: usize = 16;
/// The fewest blocks a pool sized by [`KvBudget::Sequences`] gets, and the pool's size when
/// the context length is unknown (address space is reserved for them; memory is committed as
/// blocks are written).
pub const DEFAULT_KV_BLOCKS: usize = 1024;

/// How big the paged KV pool is (blocks of [`KV_BLOCK_SIZE`] positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvBudget {
    /// Enough for this many sequences of the whole context length, or of
    /// [`MemoryOptions::ctx_size`] when set (and at least [`DEFAULT_KV_BLOCKS`]).
    Sequences(usize),
    Blocks(usize),
    /// As many blocks as fit in this many bytes (at least one).
    Bytes(usize),
}

impl Default for KvBudget {
    fn default() -> Self {
        KvBudget::Sequences(2)
    }
}

/// How much memory a model may hold and in what form: its KV pool, what the pool stores,
/// whether it keeps prefixes, and how many expert weights stay resident. The facade's
/// `ModelOptions` holds the one a user asks for and passes it to the native backend with
/// `ctx_size` clamped to the context length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Positions each sequence's KV holds, at most the package's context length.
    /// `None`: the prompt plus the new tokens of each request, capped by the context length.
    /// [`KvBudget::Sequences`] counts sequences of this length when set (`--ctx-size`).
    pub ctx_size: Option<usize>,
    /// The size of the paged KV pool. Address space is reserved for all of it; memory is
    /// committed as blocks are first written.
    pub kv: KvBudget,
    /// What the paged KV cache stores; `None`: the graph's KV dtype. `Int8` takes 0.27x the
    /// memory of an f32 cache (head size 64) and reads that much less per decoded token at
    /// long contexts; docs/PERFORMANCE.md has its accuracy. A graph whose KV is not paged
    /// keeps its own dtype (another is refused at open).
    pub kv_dtype: Option<KvDtype>,
    /// Keep full KV blocks for later sequences that start with the same ids (a server's
    /// shared system prompt is then prefilled once). Off, a finished sequence's blocks are
    /// reused first (their memory is already committed).
    pub prefix_cache: bool,
    /// Bytes of mixture-of-experts weights that may stay resident: experts are read from the
    /// model files where they lie, and past this the ones `expert_cache` picks are dropped
    /// (`None`: no bound; see `crate::residency`). Outputs do not change with it.
    pub weight_budget: Option<u64>,
    /// Which resident experts the weight budget drops first: the least recently used, or
    /// the least often used (docs/PERFORMANCE.md measures both).
    pub expert_cache: crate::ExpertCache,
}

/// How the native backend opens a language model.
#[derive(Debug, Clone)]
pub struct NativeOptions {
    pub exec: ExecOptions,
    /// How the graph names its KV inputs and outputs.
    pub kv_names: KvTemplates,
    /// The package's context length: rotary caches are sized to it (`None` leaves rotary
    /// embeddings spelled out) and [`KvBudget::Sequences`] counts in it.
    pub context_length: Option<usize>,
    /// The KV pool, its dtype and prefix cache, and the experts' weight budget.
    pub memory: MemoryOptions,
    /// A second tier of the prefix cache on disk (with `memory.prefix_cache`): every settled
    /// block is written there, and a prompt's prefix missing from the pool is read back.
    pub disk_cache: Option<oxgen_runtime::DiskTier>,
    /// Run the graph passes (off keeps the graph as loaded, for comparisons).
    pub optimize: bool,
    /// The model may run LoRA adapters ([`oxgen_runtime::LanguageModel::load_adapter`]): its
    /// projections keep outputs of their own for the adapters to add to (gate and up are
    /// not fused with the SiLU between them, a little slower).
    pub adapters: bool,
    /// Keep only the first this many layers and the output head (a self-speculative draft).
    pub layers: Option<usize>,
    /// A thread pool to share with another model (a speculative draft and its target run
    /// in turn on the same threads); `None`: a pool of its own of `exec.threads`.
    pub pool: Option<std::sync::Arc<oxgen_kernels::ThreadPool>>,
}

impl Default for NativeOptions {
    fn default() -> Self {
        NativeOptions {
            exec: ExecOptions::default(),
            kv_names: KvTemplates::default(),
            context_length: None,
            memory: MemoryOptions::default(),
            disk_cache: None,
            optimize: true,
            adapters: false,
            layers: None,
            pool: None,
        }
    }
}

/// What the native backend cannot run in a graph: the op types it has no kernel for (empty
/// when every op type is known but an opset or attribute is not), and the load error.
#[derive(Debug)]
pub struct Unsupported {
    pub missing_ops: Vec<String>,
    pub error: oxgen_graph::GraphError,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.missing_ops.is_empty() {
            write!(f, "the native backend cannot load it ({})", self.error)
        } else {
            write!(
                f,
                "the native backend has no kernel for {}",
                self.missing_ops.join(", ")
            )
        }
    }
}

/// Why [`NativeLm::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("loading {path}: {source}")]
    Onnx {
        path: String,
        source: Box<oxgen_onnx::OnnxError>,
    },
    /// The graph needs an op, opset or attribute native lacks (ONNX Runtime may run it).
    #[error("loading {path}: {unsupported}")]
    Unsupported {
        path: String,
        unsupported: Box<Unsupported>,
    },
    #[error("loading {path}: {source}")]
    Runtime { path: String, source: RuntimeError },
}

/// The graph's I/O as the contract reads it.
pub(crate) fn io_specs(graph: &Graph) -> (Vec<IoSpec>, Vec<IoSpec>) {
    let spec = |id: &ValueId| {
        let v = graph.value(*id);
        IoSpec {
            name: v.name.clone(),
            dtype: v.dtype,
            dims: v.dims.clone(),
        }
    };
    let inputs = graph.inputs.iter().map(spec).collect();
    let outputs = graph.outputs.iter().map(spec).collect();
    (inputs, outputs)
}

/// Cuts `graph` to its first `layers` layers and output head (see
/// `oxgen_graph::passes::layers`).
pub(crate) fn keep_first_layers(
    graph: &mut Graph,
    layers: usize,
    kv_names: &KvTemplates,
) -> Result<(), RuntimeError> {
    let (inputs, outputs) = io_specs(graph);
    let full = LmContract::from_io(&inputs, &outputs, kv_names)?;
    let dropped: Vec<String> = (full.layers.iter().skip(layers))
        .flat_map(|k| {
            [&k.past_key, &k.past_value, &k.present_key, &k.present_value].map(String::clone)
        })
        .collect();
    oxgen_graph::passes::layers::keep_first_layers(graph, layers, full.layers.len(), &dropped)
        .map_err(RuntimeError::Contract)
}

/// Reads the graph at `path` and builds native's typed ops from it.
pub(crate) fn load_graph(path: &Path) -> Result<Graph, OpenError> {
    let shown = || path.display().to_string();
    let onnx = oxgen_onnx::Model::load(path).map_err(|e| OpenError::Onnx {
        path: shown(),
        source: Box::new(e),
    })?;
    Graph::from_model(&onnx).map_err(|error| OpenError::Unsupported {
        path: shown(),
        unsupported: Box::new(Unsupported {
            missing_ops: oxgen_graph::Registry::default().unknown_ops(onnx.graph()),
            error,
        }),
    })
}
