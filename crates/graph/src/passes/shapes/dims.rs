//! The dimensions `Reshape`, `Unsqueeze` and `Squeeze` give, from what is known of their
//! input's dimensions and of their targets or axes.

use super::{Sym, norm_axis, product};

/// Reshape's output dimensions from the target's elements (`None` for an invalid target).
/// A `-1` is solved by cancelling the symbols the other entries share with the input, so
/// `[b, s, H*d] -> [b, s, -1, d]` gives `H`; it is `None` inside when that does not work.
pub fn reshape_dims(
    input: Option<&[Sym]>,
    target: &[Sym],
    allowzero: bool,
) -> Option<Vec<Option<Sym>>> {
    let mut out = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, &t) in target.iter().enumerate() {
        match t {
            Sym::Known(0) if !allowzero => out.push(*input?.get(i)?),
            Sym::Known(-1) if infer.is_none() => {
                infer = Some(i);
                out.push(Sym::Known(-1));
            }
            Sym::Known(v) if v >= 0 => out.push(t),
            Sym::Known(_) => return None,
            // An unknown element is that (positive) size.
            Sym::Var(_) => out.push(t),
        }
    }
    let mut out: Vec<Option<Sym>> = out.into_iter().map(Some).collect();
    if let Some(i) = infer {
        let others: Vec<Sym> = out
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .filter_map(|(_, &s)| s)
            .collect();
        out[i] = match (input.and_then(product), product(&others)) {
            (Some((ik, mut iv)), Some((ok, ov))) if ok > 0 && ik % ok == 0 => {
                let cancelled = ov.iter().all(|v| match iv.iter().position(|x| x == v) {
                    Some(p) => {
                        iv.remove(p);
                        true
                    }
                    None => false,
                });
                match (cancelled, ik / ok, iv.as_slice()) {
                    (true, q, []) => Some(Sym::Known(q)),
                    (true, 1, [v]) => Some(Sym::Var(*v)),
                    _ => None,
                }
            }
            _ => None,
        };
    }
    Some(out)
}

pub(super) fn unsqueeze_dims(d: &[Sym], axes: &[i64]) -> Option<Vec<Sym>> {
    let rank = d.len() + axes.len();
    let mut at: Vec<usize> = axes
        .iter()
        .map(|&a| norm_axis(a, rank))
        .collect::<Option<_>>()?;
    at.sort_unstable();
    at.dedup();
    if at.len() != axes.len() {
        return None;
    }
    let mut src = d.iter();
    (0..rank)
        .map(|i| {
            if at.binary_search(&i).is_ok() {
                Some(Sym::Known(1))
            } else {
                src.next().copied()
            }
        })
        .collect()
}

pub(super) fn squeeze_dims(d: &[Sym], axes: Option<&[i64]>) -> Option<Vec<Sym>> {
    match axes {
        Some(axes) => {
            let at: Vec<usize> = axes
                .iter()
                .map(|&a| norm_axis(a, d.len()))
                .collect::<Option<_>>()?;
            Some(
                d.iter()
                    .enumerate()
                    .filter(|(i, _)| !at.contains(i))
                    .map(|(_, &s)| s)
                    .collect(),
            )
        }
        // Without axes every size-1 dimension goes, which an unknown one might be.
        None if d.iter().any(|s| matches!(s, Sym::Var(_))) => None,
        None => Some(d.iter().copied().filter(|&s| s != Sym::Known(1)).collect()),
    }
}
