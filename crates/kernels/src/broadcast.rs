//! NumPy-style multidirectional broadcasting and the strided walk over it.
//!
//! Reference: ONNX `docs/Broadcasting.md`. Shapes align at the trailing dimension; a
//! dimension of 1 stretches to match the other.

use smallvec::{SmallVec, smallvec};

/// Dimensions or strides, inline up to rank 8 (no allocation on the per-token path).
pub type Dims = SmallVec<[usize; 8]>;

/// The broadcast shape of `shapes`, or `None` when two dimensions differ and neither is 1.
pub fn broadcast_shape(shapes: &[&[usize]]) -> Option<Dims> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out: Dims = smallvec![1usize; rank];
    for shape in shapes {
        let offset = rank - shape.len();
        for (i, &d) in shape.iter().enumerate() {
            let o = &mut out[offset + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    Some(out)
}

/// Element strides of `shape` viewed as `out_shape`: 0 along broadcast dimensions.
pub fn broadcast_strides(shape: &[usize], out_shape: &[usize]) -> Dims {
    let offset = out_shape.len() - shape.len();
    let mut strides: Dims = smallvec![0usize; out_shape.len()];
    let mut stride = 1;
    for i in (0..shape.len()).rev() {
        strides[offset + i] = if shape[i] == 1 { 0 } else { stride };
        stride *= shape[i];
    }
    strides
}

/// Calls `f(out_index, offsets)` for every element of `out_shape` in row-major order, where
/// `offsets[k]` is the element offset into input `k` with `strides[k]`.
pub fn for_each_offset<const N: usize>(
    out_shape: &[usize],
    strides: [&[usize]; N],
    mut f: impl FnMut(usize, [usize; N]),
) {
    let numel: usize = out_shape.iter().product();
    if numel == 0 {
        return;
    }
    let rank = out_shape.len();
    let mut index: Dims = smallvec![0usize; rank];
    let mut offsets = [0usize; N];
    for i in 0..numel {
        f(i, offsets);
        for d in (0..rank).rev() {
            index[d] += 1;
            for k in 0..N {
                offsets[k] += strides[k][d];
            }
            if index[d] < out_shape[d] {
                break;
            }
            for k in 0..N {
                offsets[k] -= strides[k][d] * out_shape[d];
            }
            index[d] = 0;
        }
    }
}

/// `out[i] = f(a[i'], b[i''])` with broadcasting; `out` has the broadcast shape `out_shape`.
pub fn binary<A: Copy, B: Copy, O>(
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    out: &mut [O],
    out_shape: &[usize],
    f: impl Fn(A, B) -> O,
) {
    if a_shape == out_shape && b_shape == out_shape {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = f(x, y);
        }
    } else if b.len() == 1 && a_shape == out_shape {
        let y = b[0];
        for (o, &x) in out.iter_mut().zip(a) {
            *o = f(x, y);
        }
    } else if a.len() == 1 && b_shape == out_shape {
        let x = a[0];
        for (o, &y) in out.iter_mut().zip(b) {
            *o = f(x, y);
        }
    } else {
        let sa = broadcast_strides(a_shape, out_shape);
        let sb = broadcast_strides(b_shape, out_shape);
        for_each_offset(out_shape, [&sa, &sb], |i, [ia, ib]| {
            out[i] = f(a[ia], b[ib])
        });
    }
}

/// `out[i] = f(c[i'], a[i''], b[i'''])` with broadcasting (for Where and Clip).
#[allow(clippy::too_many_arguments)]
pub fn ternary<C: Copy, A: Copy, B: Copy, O>(
    c: &[C],
    c_shape: &[usize],
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    out: &mut [O],
    out_shape: &[usize],
    f: impl Fn(C, A, B) -> O,
) {
    let sc = broadcast_strides(c_shape, out_shape);
    let sa = broadcast_strides(a_shape, out_shape);
    let sb = broadcast_strides(b_shape, out_shape);
    for_each_offset(out_shape, [&sc, &sa, &sb], |i, [ic, ia, ib]| {
        out[i] = f(c[ic], a[ia], b[ib])
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_broadcast_like_numpy() {
        assert_eq!(
            broadcast_shape(&[&[2, 3, 4], &[4]]).as_deref(),
            Some(&[2, 3, 4][..])
        );
        assert_eq!(
            broadcast_shape(&[&[2, 1], &[1, 5]]).as_deref(),
            Some(&[2, 5][..])
        );
        assert_eq!(broadcast_shape(&[&[2, 3], &[4]]), None);
        assert_eq!(broadcast_shape(&[&[], &[3]]).as_deref(), Some(&[3][..]));
        assert_eq!(
            broadcast_shape(&[&[0, 1], &[1, 3]]).as_deref(),
            Some(&[0, 3][..])
        );
    }

    #[test]
    fn binary_matches_an_index_by_index_walk() {
        let a: Vec<i32> = (0..6).collect(); // [2, 3]
        let b = [10, 20]; // [2, 1]
        let mut out = [0; 6];
        binary(&a, &[2, 3], &b, &[2, 1], &mut out, &[2, 3], |x, y| x + y);
        assert_eq!(out, [10, 11, 12, 23, 24, 25]);
        let c = [100, 200, 300]; // [3]
        binary(&a, &[2, 3], &c, &[3], &mut out, &[2, 3], |x, y| x + y);
        assert_eq!(out, [100, 201, 302, 103, 204, 305]);
    }
}
