//! The ops of onnxruntime's dynamic int8 exports (`quantize_dynamic`): ONNX
//! `DynamicQuantizeLinear` and `MatMulInteger`, and com.microsoft::MatMulIntegerToFloat (what
//! onnxruntime's optimizer, and `oxgen_graph::passes::integer`, make of a `MatMulInteger`
//! with its conversion, scale and bias). The products are exact integers on every path; a
//! `B` packed at load runs the VNNI kernel.

use oxgen_graph::Op;
use oxgen_kernels::ThreadPool;
use oxgen_kernels::integer::{self, PackedI8};
use oxgen_tensor::{DType, Tensor};
use smallvec::smallvec;

use super::quant::{expect_dtype, integers};
use super::{OpCtx, Outputs, Small, input, opt_input};
use crate::OpError;

pub(super) fn run(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    match op {
        Op::DynamicQuantize => dynamic_quantize(input(inputs, 0)?, ctx),
        Op::MatMulInteger => matmul_integer(inputs, ctx).map(|t| smallvec![t]),
        Op::MatMulIntegerToFloat => matmul_integer_to_float(inputs, ctx).map(|t| smallvec![t]),
        _ => unreachable!("ops::run routes only the int8 ops here"),
    }
}

/// ONNX DynamicQuantizeLinear: the uint8 codes of a float32 tensor, its scale and zero point.
fn dynamic_quantize(x: &Tensor, ctx: &mut OpCtx) -> Result<Outputs, OpError> {
    expect_dtype(x, DType::F32, "DynamicQuantizeLinear's input")?;
    let mut codes = ctx.alloc(DType::U8, x.dims())?;
    let (scale, zero) =
        integer::dynamic_quantize(x.as_slice::<f32>()?, codes.as_mut_slice::<u8>()?)?;
    Ok(smallvec![
        codes,
        Tensor::scalar(scale),
        Tensor::scalar(zero)
    ])
}

/// A MatMulInteger operand's zero points as i32: one, or `per` (a row of A's, a column of
/// B's); checked to be of the operand's type.
fn integer_zero_points(
    op: &str,
    t: &Tensor,
    zero: Option<&Tensor>,
    per: usize,
    what: &str,
) -> Result<Vec<i32>, OpError> {
    if !matches!(t.dtype(), DType::U8 | DType::I8) {
        return Err(OpError::DType {
            dtype: t.dtype(),
            detail: format!(" for {op}'s {what}: expected uint8 or int8"),
        });
    }
    let zeros = match zero {
        None => vec![0],
        Some(z) if z.dtype() != t.dtype() => {
            return Err(OpError::DType {
                dtype: z.dtype(),
                detail: format!(" for {op}'s {what} zero point: expected {}", t.dtype()),
            });
        }
        Some(z) => integers(z, what)?.into_iter().map(|v| v as i32).collect(),
    };
    if zeros.len() != 1 && zeros.len() != per {
        return Err(OpError::shape(format!(
            "{op}'s {what} zero point has {} values; give one, or {per}",
            zeros.len()
        )));
    }
    Ok(zeros)
}

/// An integer product's operands, checked: `A` (any rank, `m` rows of `k`) against a 2-D `B`
/// (`k × n`), the zero points one per row of `A` (repeated over its batch) and one per column
/// of `B`.
struct Product<'a> {
    a: &'a Tensor,
    b: &'a Tensor,
    a_zero: Vec<i32>,
    b_zero: Vec<i32>,
    m: usize,
    k: usize,
    n: usize,
    /// The output's shape: `A`'s leading dimensions, then `n`.
    dims: Small<usize>,
}

impl<'a> Product<'a> {
    /// `A` and `B` at inputs 0 and 1, their zero points at `zeros`, of the op named `op` (for
    /// errors).
    fn new(
        op: &str,
        inputs: &[Option<&'a Tensor>],
        zeros: [usize; 2],
    ) -> Result<Product<'a>, OpError> {
        let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
        let (&[k2, n], Some((&k, batch))) = (b.dims(), a.dims().split_last()) else {
            return Err(OpError::shape(format!(
                "{op} runs A of rank 1 or more against a 2-D B, got {} and {}",
                a.shape(),
                b.shape()
            )));
        };
        if k != k2 {
            return Err(OpError::shape(format!(
                "{op} inner dimensions differ: A {} has {k} columns, B {} has {k2} rows",
                a.shape(),
                b.shape()
            )));
        }
        let m: usize = batch.iter().product();
        let rows = batch.last().copied().unwrap_or(1);
        let a_zero = integer_zero_points(op, a, opt_input(inputs, zeros[0]), rows, "A")?;
        let a_zero = match a_zero.len() {
            1 => a_zero,
            _ => (0..m).map(|i| a_zero[i % rows]).collect(),
        };
        let b_zero = integer_zero_points(op, b, opt_input(inputs, zeros[1]), n, "B")?;
        let b_zero = match b_zero.len() {
            1 => vec![b_zero[0]; n],
            _ => b_zero,
        };
        let dims = batch.iter().copied().chain([n]).collect();
        Ok(Product {
            a,
            b,
            a_zero,
            b_zero,
            m,
            k,
            n,
            dims,
        })
    }

    /// `B` packed at load, when this node has it and `A` is uint8 (the VNNI kernel's form).
    fn packed<'p>(&self, ctx: &OpCtx<'p>) -> Option<&'p PackedI8> {
        (ctx.lowered.int8()).filter(|p| self.a.dtype() == DType::U8 && p.dims() == (self.k, self.n))
    }

    /// The int32 products into `out` by the loop (any pair of uint8 and int8 operands).
    fn run_loop(&self, out: &mut [i32], pool: &ThreadPool) -> Result<(), OpError> {
        let (a, b, shape) = (self.a, self.b, (self.m, self.k, self.n));
        macro_rules! product {
            ($a:ty, $b:ty) => {
                integer::matmul_integer(
                    a.as_slice::<$a>()?,
                    &self.a_zero,
                    b.as_slice::<$b>()?,
                    &self.b_zero,
                    out,
                    shape,
                    pool,
                )
            };
        }
        match (a.dtype(), b.dtype()) {
            (DType::U8, DType::U8) => product!(u8, u8),
            (DType::U8, _) => product!(u8, i8),
            (_, DType::U8) => product!(i8, u8),
            _ => product!(i8, i8),
        }?;
        Ok(())
    }
}

/// ONNX MatMulInteger: `(A - a_zero_point) · (B - b_zero_point)` in int32, for A of any rank
/// against a 2-D B (the weights of onnxruntime's dynamic int8 exports).
fn matmul_integer(inputs: &[Option<&Tensor>], ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let p = Product::new("MatMulInteger", inputs, [2, 3])?;
    let mut out = ctx.alloc(DType::I32, p.dims.clone())?;
    let o = out.as_mut_slice::<i32>()?;
    match p.packed(ctx) {
        Some(packed) => {
            let zeros = (p.a_zero.as_slice(), p.b_zero.as_slice());
            let a = p.a.as_slice::<u8>()?;
            let copy = |_: usize, _: usize, v: &[i32], o: &mut [i32]| o.copy_from_slice(v);
            integer::packed_product(a, zeros, packed, o, p.m, ctx.pool, &copy)?
        }
        None => p.run_loop(o, ctx.pool)?,
    }
    Ok(out)
}

/// com.microsoft::MatMulIntegerToFloat: `float(A·B in int32) · (a_scale · b_scale) + bias`
/// (inputs A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias), `a_scale` one value,
/// `b_scale` one or one per column, the bias one per column: each output is converted,
/// multiplied and added with one rounding each, as `MatMulInteger`, `Cast`, `Mul` and `Add`
/// compute it.
fn matmul_integer_to_float(inputs: &[Option<&Tensor>], ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let p = Product::new("MatMulIntegerToFloat", inputs, [4, 5])?;
    let n = p.n;
    let scale = |k: usize, what: &str, per_column: bool| -> Result<&[f32], OpError> {
        let t = input(inputs, k)?;
        expect_dtype(t, DType::F32, what)?;
        let ok = t.numel() == 1 || (per_column && t.dims() == [n]);
        if !ok {
            let want = if per_column {
                format!("one value or [{n}]")
            } else {
                "one value".into()
            };
            return Err(OpError::shape(format!(
                "MatMulIntegerToFloat's {what} has shape {}; expected {want}",
                t.shape()
            )));
        }
        Ok(t.as_slice::<f32>()?)
    };
    let (a_scale, b_scale) = (scale(2, "a_scale", false)?[0], scale(3, "b_scale", true)?);
    let multipliers: Vec<f32> = (0..n)
        .map(|j| a_scale * b_scale[j % b_scale.len()])
        .collect();
    let bias = match opt_input(inputs, 6) {
        None => None,
        Some(t) => {
            expect_dtype(t, DType::F32, "MatMulIntegerToFloat's bias")?;
            if t.dims() != [n] {
                return Err(OpError::shape(format!(
                    "MatMulIntegerToFloat's bias has shape {}; expected [{n}], one per column of B",
                    t.shape()
                )));
            }
            Some(t.as_slice::<f32>()?)
        }
    };
    // `out[j..] = float(values) · multipliers[j..] (+ bias[j..])`.
    let finish = |j: usize, values: &[i32], out: &mut [f32]| {
        integer::scale_to_float(values, &multipliers[j..], bias.map(|b| &b[j..]), out);
    };
    let mut out = ctx.alloc(DType::F32, p.dims.clone())?;
    let o = out.as_mut_slice::<f32>()?;
    if let Some(packed) = p.packed(ctx) {
        let zeros = (p.a_zero.as_slice(), p.b_zero.as_slice());
        let a = p.a.as_slice::<u8>()?;
        integer::packed_product(a, zeros, packed, o, p.m, ctx.pool, &|_, j, v, o| {
            finish(j, v, o)
        })?;
        return Ok(out);
    }
    let mut products = ctx.alloc(DType::I32, p.dims.clone())?;
    p.run_loop(products.as_mut_slice::<i32>()?, ctx.pool)?;
    let values = products.as_slice::<i32>()?;
    for (row, values) in o
        .chunks_exact_mut(n.max(1))
        .zip(values.chunks_exact(n.max(1)))
    {
        finish(0, values, row);
    }
    ctx.arena.recycle(products);
    Ok(out)
}
