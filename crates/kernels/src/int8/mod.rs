//! Int8 activations, shared by the kernel families whose weights take them (`MatMulNBits` at
//! `accuracy_level` 4, MXFP4): a row of f32 activations quantized in blocks along K with one
//! scale per block (`quantize`: the scalar reference and its AVX2 loop, bit for bit), laid
//! out for the kernels with its block sums (`row`), and the variants of the int8 dot-product
//! kernels this machine runs (`variant`: AVX2, AVX-VNNI, AVX-512 VNNI).

mod quantize;
mod row;
mod variant;

pub use quantize::{quantize_row, quantize_row_reference};
pub(crate) use row::{QuantizedRow, with_rows, with_rows_and_meta};
pub use variant::Variant;
pub(crate) use variant::runs_kernels;
