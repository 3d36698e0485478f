//! oxgen-exec: the native backend.
//!
//! `Graph → Plan → Session`. Planning lowers each node of a [`oxgen_graph::Graph`] into the
//! op that runs it, owning what it runs with ([`Lowered`]: weights repacked for its kernel,
//! its subgraphs' sessions, its paged KV layer), and records each value's last use once
//! ([`Plan`]); a [`NativeSession`] only executes the plan: shapes are resolved from the
//! actual inputs at run time, each op is dispatched to its kernels with what it owns, and a
//! value's buffer returns to a free list after its last use so later activations reuse it. The peak of live activation bytes is
//! reported per run. [`optimize`] runs the graph passes (folding, fusion into
//! `SimplifiedLayerNormalization`, `RotaryEmbedding`, `GroupQueryAttention`) with these
//! kernels as their evaluator; [`NativeLm`] does so before planning.
//!
//! [`NativeLm::open`] is the backend's door: it loads a graph (through `oxgen-onnx`), optimizes
//! and plans it, and sizes the paged KV pool once.
//!
//! This crate must never parse file formats itself or know which other backends exist.

mod arena;
mod error;
mod kv;
mod lm;
pub mod lora;
mod lower;
mod open;
pub mod ops;
mod optimize;
mod plan;
mod residency;
pub use residency::ExpertCache;
mod session;

pub use arena::Arena;
pub use error::{ExecError, OpError};
pub use kv::{KvStore, PagedLayer, PagedStep};
pub use lm::NativeLm;
pub use lower::Lowered;
pub use open::{
    DEFAULT_KV_BLOCKS, KV_BLOCK_SIZE, KvBudget, MemoryOptions, NativeOptions, OpenError,
    Unsupported,
};
pub use optimize::{NativeEvaluator, optimize};
pub use oxgen_graph::passes::layers::HIDDEN_STATES;
pub use oxgen_graph::passes::{Options as PassOptions, Report as PassReport};
pub use oxgen_kernels::ThreadPool;
pub use oxgen_runtime::OpTime;
pub use plan::{Plan, PlannedOp};
pub use session::{ExecOptions, NativeSession, RunStats, pool_for, pool_of};
