//! `MatMulNBits` (com.microsoft): `Y = A · dequant(B)ᵀ (+ bias)` with B block-quantized along
//! K, as onnxruntime's `docs/ContribOperators.md` specifies it. One scalar reference per
//! arithmetic, fast x86 kernels that give their reference's bits, and the repacked layout
//! models load into.
//!
//! The files, each depending only on those listed before it:
//! - `layout`: the weights' geometry and layout ([`NBitsLayout`], [`QuantWeights`],
//!   [`ZeroPoints`]), argument checks, the split of output rows over the pool;
//! - `support`: which layouts the fast int8 kernels take here ([`supported`]; their
//!   variants are [`crate::int8::Variant`]);
//! - `stored_f32`: f32 activations in vectors of 16 (AVX-512) or 8 (AVX2) columns, four at a
//!   time, a task's rows sharing each block's dequantized weights, with the reference's bits;
//! - `reference`: [`matmul_nbits`], the f32 reference (any float type), and
//!   [`matmul_nbits_f32`], which takes `stored_f32` where it can;
//! - `interleaved`: [`Interleaved`], weights repacked at load for `stored_f32` (each group of
//!   eight rows' codes interleaved, as the kernel otherwise gathers them every run), and
//!   [`matmul_interleaved_f32`];
//! - `int8_reference`: the int8-activation arithmetic ([`matmul_nbits_int8_reference`]);
//! - `stored_avx2`: AVX2 / AVX-VNNI kernel over the stored (ONNX) layout;
//! - `int8`: [`matmul_nbits_int8`], which picks that kernel or the reference;
//! - `packed`: [`PackedNBits`], the weights repacked at load into column tiles;
//! - `tile_io`: what the packed tile kernels share (checked pointers, prefetches);
//! - `packed_avx2`, `packed_avx512`: the tile kernels (x86-64 only);
//! - `packed_matmul`: [`matmul_packed`] and its variants, the passes over the tiles.

mod int8;
mod int8_reference;
mod interleaved;
mod layout;
mod packed;
#[cfg(target_arch = "x86_64")]
mod packed_avx2;
#[cfg(target_arch = "x86_64")]
mod packed_avx512;
mod packed_matmul;
mod reference;
mod stored_avx2;
mod stored_f32;
mod support;
mod tile_io;

pub use int8::{matmul_nbits_int8, matmul_nbits_int8_variant};
pub use int8_reference::{block_offset, matmul_nbits_int8_reference};
pub use interleaved::{Interleaved, matmul_interleaved_f32};
pub use layout::{NBitsLayout, QuantWeights, TILE, ZeroPoints};
pub use packed::PackedNBits;
pub use packed_matmul::{matmul_packed, matmul_packed_glu, matmul_packed_parts};
pub use reference::{matmul_nbits, matmul_nbits_f32};
pub use support::{supported, supported_on};
