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
    } else if let Some(inner) = (a_shape == out_shape)
        .then(|| repeats(b_shape, out_shape))
        .flatten()
    {
        // A bias row, a mask row: `b` repeats every `inner` elements.
        for (o, x) in out.chunks_exact_mut(inner).zip(a.chunks_exact(inner)) {
            for ((o, &x), &y) in o.iter_mut().zip(x).zip(b) {
                *o = f(x, y);
            }
        }
    } else if let Some(inner) = (b_shape == out_shape)
        .then(|| repeats(a_shape, out_shape))
        .flatten()
    {
        for (o, y) in out.chunks_exact_mut(inner).zip(b.chunks_exact(inner)) {
            for ((o, &x), &y) in o.iter_mut().zip(a).zip(y) {
                *o = f(x, y);
            }
        }
    } else {
        let sa = broadcast_strides(a_shape, out_shape);
        let sb = broadcast_strides(b_shape, out_shape);
        for_each_offset(out_shape, [&sa, &sb], |i, [ia, ib]| {
            out[i] = f(a[ia], b[ib])
        });
    }
}

/// `Some(inner)` when `small`, right-aligned against `out_shape`, is ones and then exactly
/// `out_shape`'s last dimensions (of `inner` elements, at least one): it repeats every
/// `inner` elements of the output.
fn repeats(small: &[usize], out_shape: &[usize]) -> Option<usize> {
    let tail: &[usize] = {
        let ones = small.iter().take_while(|&&d| d == 1).count();
        &small[ones..]
    };
    let inner: usize = tail.iter().product();
    (tail.len() <= out_shape.len() && out_shape.ends_with(tail) && inner > 0).then_some(inner)
}

/// `out[i] = f(c[i'], a[i''], b[i'''])` with broadcasting (for Where and Clip); each input
/// comes with its shape.
pub fn ternary<C: Copy, A: Copy, B: Copy, O>(
    (c, c_shape): (&[C], &[usize]),
    (a, a_shape): (&[A], &[usize]),
    (b, b_shape): (&[B], &[usize]),
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
    fn a_repeated_row_gives_what_the_general_path_gives() {
        let out_shape = [2, 3, 4];
        let a: Vec<f32> = (0..24).map(|i| i as f32).collect();
        for b_shape in [&[4][..], &[1, 1, 4], &[3, 4], &[1, 3, 4], &[1, 1, 1]] {
            let n: usize = b_shape.iter().product();
            let b: Vec<f32> = (0..n).map(|i| 100.0 * (i as f32 + 1.0)).collect();
            let general = |x: &[f32], xs: &[usize], y: &[f32], ys: &[usize]| {
                let (sx, sy) = (
                    broadcast_strides(xs, &out_shape),
                    broadcast_strides(ys, &out_shape),
                );
                let mut out = vec![0f32; 24];
                for_each_offset(&out_shape, [&sx, &sy], |i, [ix, iy]| out[i] = x[ix] - y[iy]);
                out
            };
            let mut out = vec![0f32; 24];
            binary(&a, &out_shape, &b, b_shape, &mut out, &out_shape, |x, y| {
                x - y
            });
            assert_eq!(out, general(&a, &out_shape, &b, b_shape), "{b_shape:?}");
            binary(&b, b_shape, &a, &out_shape, &mut out, &out_shape, |x, y| {
                x - y
            });
            assert_eq!(
                out,
                general(&b, b_shape, &a, &out_shape),
                "{b_shape:?} first"
            );
        }
        assert_eq!(repeats(&[3, 1], &[2, 3, 4]), None);
        assert_eq!(repeats(&[1, 3, 4], &[2, 3, 4]), Some(12));
    }

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
