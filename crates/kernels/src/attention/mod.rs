//! Causal grouped-query attention (com.microsoft::GroupQueryAttention) over a contiguous KV
//! cache, and over a paged one for a ragged batch ([`paged`]): one scalar reference for the
//! arithmetic of a row, and AVX2 and AVX-512 rows that give its bits, for f32 queries over a
//! cache of f32, f16, bf16 or int8 ([`kv`]).
//!
//! The files, each depending only on those listed before it:
//! - `shape`: a call's arguments ([`GqaShape`], [`ScoreMod`], [`Rows`]);
//! - `exp`: the softmax exponentials and their sum (reference and AVX2);
//! - [`kv`]: what a cache stores per head vector (f32, f16, bf16, or int8 with a scale);
//! - `avx2`, `avx512`: the dot products and value sums of a row over any cache element;
//! - `group`: the row arithmetic of a group of heads over their keys (the reference, and
//!   the dispatch to `avx2` and `avx512` through [`crate::cpu`]);
//! - `cache`: the KV cache updates and rotated queries around a step;
//! - `gqa`: [`attention`] over contiguous caches (tests in `gqa_tests.rs`);
//! - [`paged`]: attention over block tables (its argument checks in `paged/checks.rs`, the split
//!   of a decode step's tiles over threads in `paged/tiles.rs`, tests in
//!   `paged_tests.rs`).

mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod cache;
mod exp;
mod gqa;
mod group;
pub mod kv;
pub mod paged;
mod shape;

pub use cache::{append_kv, copy_prefix, rotate_query};
pub(crate) use exp::{INV_LN2_32, LN2_HI_32, LN2_LO_32, TAYLOR32, exp_shifted_sum, lane_tree};
pub use gqa::{GqaInputs, attention, attention_reference, heads_to_rows, scratch_len};
pub use shape::{GqaShape, Rows, ScoreMod};
