//! Graph passes: rewrites that keep a graph's results and make it cheaper to run.
//!
//! Exporters such as optimum (`torch.onnx`) spell a decoder out in thousands of small ops:
//! shape arithmetic through `Shape`/`Gather`/`Concat`, RMSNorm as seven element-wise ops,
//! rotary embeddings through `Slice`/`Neg`/`Concat`, attention as `MatMul`/`Softmax` over KV
//! grown by `Concat(past, new)`, which allocates and copies the whole cache every token. The
//! passes, in order:
//!
//! 0. [`lora`]: a LoRA-input graph's empty branches (`Add(x W, (x A) B)` over zero-rank
//!    default `A` and `B`) → the projection alone; the backend applies adapters itself.
//! 1. [`fold`]: constants, and shape arithmetic whose dimensions are known statically
//!    ([`shapes`] infers dimensions symbolically, so `Shape(x)[3]` folds when `x`'s last
//!    dimension is fixed even though its sequence length is not).
//! 2. [`norm`]: the RMSNorm pattern → `SimplifiedLayerNormalization`; a residual `Add`
//!    feeding it → `com.microsoft::SkipSimplifiedLayerNormalization`.
//! 3. [`rotary`]: `x * cos + rotate_half(x) * sin` → `com.microsoft::RotaryEmbedding` with
//!    cos/sin caches computed once from the model's own subgraph (needs
//!    [`Options::context_length`]).
//! 4. [`attention`]: `Concat` KV, repeat_kv, `Q·Kᵀ`, scale, causal mask, `Softmax`, `·V` →
//!    `com.microsoft::GroupQueryAttention`, which appends KV in place (needs the language-model
//!    contract).
//!
//!    [`longrope`]: LongRoPE's `If` between short and long rotary caches → both caches on
//!    each `GroupQueryAttention`, chosen per sequence (also needs the contract).
//! 5. [`group`]: `MatMulNBits` nodes reading the same input → one
//!    `oxgen::MatMulNBitsGroup` (one activation quantization and one parallel region for a
//!    layer's Q, K and V, or gate and up).
//! 6. [`silu`]: `Mul(Mul(g, Sigmoid(g)), u)` → `oxgen::SiluMul(g, u)`; a `SiluMul` over
//!    the two outputs of a gate/up `MatMulNBitsGroup` → one `oxgen::MatMulNBitsGlu`.
//! 7. [`integer`]: a dynamic int8 product spelled out (`MatMulInteger`, `Cast`, the scales'
//!    `Mul`, the bias `Add`) → `com.microsoft::MatMulIntegerToFloat`.
//! 8. [`gelu`]: the erf GELU spelled out (`Div`, `Erf`, `Add`, two `Mul`s), with the bias
//!    `Add` before it → `oxgen::ErfGelu`.
//! 9. [`heads`]: an encoder's self-attention spelled out (`Reshape`/`Transpose` into heads,
//!    `q·kᵀ`, its scale, the mask `Add`, `Softmax`, `·v`, the heads merged) →
//!    `oxgen::EncoderAttention`.
//!
//! Patterns are matched by structure (op types, edges, constant values, axes, inferred
//! shapes), never by node or model names. A pattern that does not match exactly leaves the
//! graph as it was: correct, only slower. Values that only a run can decide (a causal mask, a
//! rotary table) are checked by running the model's own nodes through an [`Evaluator`] that
//! the backend supplies, since this crate never executes.
//!
//! The language-model rewrites hold for the way language models are fed here (what
//! `NativeLm` does): every sequence's `attention_mask` is all ones (no padding) and its
//! `position_ids` run from its cached length on. `GroupQueryAttention` takes positions and
//! key counts from the mask, so a graph rewritten by [`attention`] ignores other masks and
//! positions.

pub mod attention;
mod edit;
pub mod fold;
pub mod gelu;
pub mod group;
pub mod heads;
pub mod integer;
pub mod layers;
pub mod longrope;
pub mod lora;
pub mod norm;
pub mod rotary;
pub mod shapes;
pub mod silu;

use oxgen_tensor::{DType, Tensor};

use crate::{Graph, ValueId};

/// Runs nodes for the passes: the graph crate never executes, so a backend supplies this.
pub trait Evaluator {
    /// Computes `wanted` by running the nodes they depend on in `graph`. `feeds` gives values
    /// for graph inputs (or for any value, which cuts the graph there); initializers are
    /// read from the graph. Fails (with a reason) when a needed input is not fed or a node
    /// fails.
    fn evaluate(
        &mut self,
        graph: &Graph,
        feeds: &[(ValueId, Tensor)],
        wanted: &[ValueId],
    ) -> Result<Vec<Tensor>, String>;
}

/// What the attention rewrite must know of a language model's inputs: which hold the ids,
/// the mask, the positions and each layer's past KV, and the KV's shape. It is the backend
/// seam's `LmContract` as the graph sees it (this crate knows no backend).
#[derive(Debug, Clone)]
pub struct LmInputs {
    pub input_ids: (String, DType),
    pub attention_mask: Option<(String, DType)>,
    pub position_ids: Option<(String, DType)>,
    /// Per layer, in layer order: the past key and past value inputs.
    pub past_kv: Vec<(String, String)>,
    pub kv_dtype: DType,
    pub kv_heads: usize,
    pub head_size: usize,
}

/// What the passes may assume and do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Run the passes at all (off keeps the graph as loaded, for comparisons).
    pub enabled: bool,
    /// Keep every projection's output a value of its own (LoRA adapters add to them): no
    /// gate and up projections fused with the SiLU between them.
    pub keep_projections: bool,
    /// Positions the rotary caches cover: the model's context length (`config.json`'s
    /// `max_position_embeddings`). `None` leaves rotary embeddings spelled out, since a cache
    /// needs a size; positions past it would fail at run time.
    pub context_length: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            enabled: true,
            keep_projections: false,
            context_length: None,
        }
    }
}

/// What the passes did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub nodes_before: usize,
    pub nodes_after: usize,
    /// Nodes replaced by initializers.
    pub folded: usize,
    pub rms_norms: usize,
    pub skip_norms: usize,
    pub rotaries: usize,
    /// LongRoPE `If`s turned into a per-sequence choice ([`longrope`]).
    pub long_ropes: usize,
    pub attentions: usize,
    /// `MatMulNBitsGroup` nodes made.
    pub matmul_groups: usize,
    /// Gated SiLUs fused into `SiluMul`.
    pub silu_muls: usize,
    /// `SiluMul`s fused with their gate and up projections into `MatMulNBitsGlu`.
    pub glus: usize,
    /// Spelled-out dynamic int8 products fused into `MatMulIntegerToFloat`.
    pub integer_products: usize,
    /// Spelled-out erf GELUs fused into `ErfGelu`.
    pub erf_gelus: usize,
    /// Spelled-out encoder self-attentions fused into `EncoderAttention`.
    pub encoder_attentions: usize,
    /// Empty LoRA branches (zero-rank defaults of a graph that takes adapters) removed.
    pub lora_branches: usize,
    /// Why a candidate pattern was left alone, one line each (for `inspect` and debugging).
    pub skipped: Vec<String>,
}

/// Runs every pass on `graph` in place. `lm` is the language-model contract when the graph
/// is stepped as one (the attention rewrite needs it: which inputs hold the mask, positions
/// and KV). Never fails: a pass that cannot prove a rewrite leaves the graph alone.
pub fn optimize(
    graph: &mut Graph,
    eval: &mut dyn Evaluator,
    lm: Option<&LmInputs>,
    options: &Options,
) -> Report {
    let mut report = Report {
        nodes_before: graph.nodes.len(),
        ..Report::default()
    };
    if options.enabled {
        report.lora_branches = lora::strip_empty_lora(graph);
        report.folded += fold::run(graph, eval);
        report.rms_norms = norm::fuse_rms_norm(graph);
        report.skip_norms = norm::fuse_skip_norm(graph);
        if let Some(context_length) = options.context_length {
            report.rotaries = rotary::run(graph, eval, context_length, &mut report.skipped);
        }
        if let Some(lm) = lm {
            report.attentions = attention::run(graph, eval, lm, &mut report.skipped);
            if let Some((mask, _)) = &lm.attention_mask {
                report.long_ropes = longrope::run(graph, mask, &mut report.skipped);
            }
        }
        report.folded += fold::run(graph, eval);
        report.matmul_groups = group::group_matmul_nbits(graph);
        report.silu_muls = silu::fuse_silu_mul(graph);
        if !options.keep_projections {
            report.glus = silu::fuse_glu(graph);
        }
        report.integer_products = integer::fuse_integer_to_float(graph);
        report.erf_gelus = gelu::fuse_erf_gelu(graph);
        report.encoder_attentions = heads::fuse_encoder_attention(graph);
    }
    report.nodes_after = graph.nodes.len();
    report
}
