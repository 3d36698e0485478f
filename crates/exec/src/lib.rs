//! oxgen-exec: the native backend.
//!
//! A [`Plan`] orders a [`oxgen_graph::Graph`]'s nodes once and records each value's last
//! use; a [`NativeSession`] runs it: shapes are resolved from the actual inputs at run time,
//! each typed op is dispatched to its kernels, and a value's buffer returns to a free list
//! after its last use so later activations reuse it. The peak of live activation bytes is
//! reported per run. [`optimize`] runs the graph passes (folding, fusion into
//! `SimplifiedLayerNormalization`, `RotaryEmbedding`, `GroupQueryAttention`) with these
//! kernels as their evaluator; [`NativeLm`] does so before planning.
//!
//! This crate must never parse files or know which other backends exist.

mod arena;
mod error;
mod kv;
mod lm;
pub mod ops;
mod optimize;
mod plan;
mod session;

pub use arena::Arena;
pub use error::{ExecError, OpError};
pub use kv::{KvStore, PagedLayer, PagedStep};
pub use lm::{DEFAULT_KV_BLOCKS, KV_BLOCK_SIZE, KvConfig, NativeLm};
pub use optimize::{NativeEvaluator, optimize};
pub use oxgen_graph::passes::{Options as PassOptions, Report as PassReport};
pub use plan::Plan;
pub use session::{ExecOptions, NativeSession, OpTime, RunStats};
