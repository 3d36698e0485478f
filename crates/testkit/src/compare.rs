//! Comparing tensors: exact for integers and bools, `|a - e| <= atol + rtol * |e|` for
//! floats (numpy's `assert_allclose`, which the ONNX backend runner uses), NaN equal to NaN.

use oxgen_tensor::{DType, Tensor, bf16, f16};

/// Tolerances for float comparisons.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

impl Tolerance {
    /// The ONNX backend runner's defaults.
    pub const ONNX: Tolerance = Tolerance {
        rtol: 1e-3,
        atol: 1e-7,
    };
}

fn values(t: &Tensor) -> Option<Vec<f64>> {
    Some(match t.dtype() {
        DType::F32 => t
            .as_slice::<f32>()
            .ok()?
            .iter()
            .map(|&v| v as f64)
            .collect(),
        DType::F64 => t.as_slice::<f64>().ok()?.to_vec(),
        DType::F16 => t
            .as_slice::<f16>()
            .ok()?
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DType::BF16 => t
            .as_slice::<bf16>()
            .ok()?
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        _ => return None,
    })
}

/// Why `actual` differs from `expected`, or `None` when they agree.
pub fn mismatch(actual: &Tensor, expected: &Tensor, tol: Tolerance) -> Option<String> {
    if actual.dtype() != expected.dtype() {
        return Some(format!(
            "dtype {} != expected {}",
            actual.dtype(),
            expected.dtype()
        ));
    }
    if actual.dims() != expected.dims() {
        return Some(format!(
            "shape {} != expected {}",
            actual.shape(),
            expected.shape()
        ));
    }
    match (values(actual), values(expected)) {
        (Some(a), Some(e)) => {
            let mut bad = 0;
            let mut first = None;
            let mut worst = 0.0f64;
            for (i, (&x, &y)) in a.iter().zip(&e).enumerate() {
                let ok = (x.is_nan() && y.is_nan())
                    || x == y
                    || (x - y).abs() <= tol.atol + tol.rtol * y.abs();
                if !ok {
                    bad += 1;
                    worst = worst.max((x - y).abs());
                    first.get_or_insert((i, x, y));
                }
            }
            first.map(|(i, x, y)| {
                format!("{bad} of {} values differ beyond rtol {} atol {} (first at {i}: {x} vs expected {y}; max abs diff {worst:e})", a.len(), tol.rtol, tol.atol)
            })
        }
        _ => {
            let (a, e) = (actual.as_bytes(), expected.as_bytes());
            let width = (actual.dtype().bits() / 8).max(1);
            a.chunks(width)
                .zip(e.chunks(width))
                .position(|(x, y)| x != y)
                .map(|i| {
                    format!(
                        "element {i} differs (exact comparison for {})",
                        actual.dtype()
                    )
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_tolerance_and_exact_ints() {
        let a = Tensor::from_slice([3], &[1.0f32, 2.0, f32::NAN]).unwrap();
        let b = Tensor::from_slice([3], &[1.0005f32, 2.0, f32::NAN]).unwrap();
        assert!(mismatch(&a, &b, Tolerance::ONNX).is_none());
        let c = Tensor::from_slice([3], &[1.01f32, 2.0, f32::NAN]).unwrap();
        assert!(
            mismatch(&a, &c, Tolerance::ONNX)
                .unwrap()
                .contains("1 of 3")
        );
        let i = Tensor::from_slice([2], &[1i64, 2]).unwrap();
        let j = Tensor::from_slice([2], &[1i64, 3]).unwrap();
        assert!(
            mismatch(&i, &j, Tolerance::ONNX)
                .unwrap()
                .contains("element 1")
        );
        assert!(mismatch(&i, &a, Tolerance::ONNX).unwrap().contains("dtype"));
    }
}
