//! What a GroupQueryAttention step does around the attention itself, on contiguous caches:
//! the past positions copied into a new cache ([`copy_prefix`]), the new keys and values
//! appended with their rotary embedding ([`append_kv`]), and the queries rotated
//! ([`rotate_query`]). Layouts as in [`super::gqa`].

use super::shape::{GqaShape, Rows};
use crate::acc::Accum;
use crate::error::{KernelError, check_len};
use crate::rotary::{Positions, Rope, rotate_one};

fn check_starts(starts: &[usize], shape: &GqaShape, what: &'static str) -> Result<(), KernelError> {
    check_len(what, starts.len(), shape.batch)?;
    match starts
        .iter()
        .position(|&p| p.checked_add(shape.seq).is_none_or(|e| e > shape.capacity))
    {
        Some(b) => Err(KernelError::Shape(format!(
            "batch entry {b}: rows {}..{}+{} do not fit in a cache of {} positions",
            starts[b], starts[b], shape.seq, shape.capacity
        ))),
        None => Ok(()),
    }
}

/// Copies the first `lens[b]` positions of every (batch, kv head) of `past` (capacity
/// `past_capacity`) into `present` (capacity `shape.capacity`), the concatenation half of a
/// non-shared KV update.
pub fn copy_prefix<T: Copy>(
    past: &[T],
    past_capacity: usize,
    present: &mut [T],
    shape: &GqaShape,
    lens: &[usize],
) -> Result<(), KernelError> {
    shape.check()?;
    let hs = shape.head_size;
    check_len(
        "past cache",
        past.len(),
        shape.batch * shape.kv_heads * past_capacity * hs,
    )?;
    check_len("present cache", present.len(), shape.cache_len())?;
    check_len("past lengths", lens.len(), shape.batch)?;
    if let Some(b) = lens
        .iter()
        .position(|&l| l > past_capacity.min(shape.capacity))
    {
        return Err(KernelError::Shape(format!(
            "batch entry {b}: {} past positions do not fit in a past cache of {past_capacity} or a present cache of {}",
            lens[b], shape.capacity
        )));
    }
    for (b, &len) in lens.iter().enumerate() {
        for h in 0..shape.kv_heads {
            let head = b * shape.kv_heads + h;
            let n = len * hs;
            present[head * shape.capacity * hs..][..n]
                .copy_from_slice(&past[head * past_capacity * hs..][..n]);
        }
    }
    Ok(())
}

/// Writes the `shape.seq` new head vectors of every batch entry into `cache` at positions
/// `start[b]..start[b] + seq`, rotating them with `rope` (positions `start[b] + s`) when set.
/// `src` holds `shape.kv_heads` heads per row.
pub fn append_kv<T: Accum<Acc = f32>>(
    src: &Rows<T>,
    shape: &GqaShape,
    start: &[usize],
    rope: Option<&Rope<T>>,
    cache: &mut [T],
) -> Result<(), KernelError> {
    shape.check()?;
    let GqaShape {
        batch,
        seq,
        kv_heads,
        head_size: hs,
        capacity,
        ..
    } = *shape;
    src.check(batch * seq, kv_heads, hs, "new keys/values")?;
    check_len("KV cache", cache.len(), shape.cache_len())?;
    check_starts(start, shape, "cache starts")?;
    for b in 0..batch {
        let rope = rope.map(|r| r.for_len(start[b] + seq));
        for s in 0..seq {
            for h in 0..kv_heads {
                let x = src.head(b * seq + s, h, hs);
                let dst = &mut cache[((b * kv_heads + h) * capacity + start[b] + s) * hs..][..hs];
                match &rope {
                    Some(r) => {
                        rotate_one(x, Positions::Start(start).row(b, s, seq, r.rows())?, r, dst)?
                    }
                    None => dst.copy_from_slice(x),
                }
            }
        }
    }
    Ok(())
}

/// Rotates the query heads of `q` (positions `start[b] + s`) into `out`, laid out
/// `(batch, seq, heads * head_size)`.
pub fn rotate_query<T: Accum<Acc = f32>>(
    q: &Rows<T>,
    shape: &GqaShape,
    start: &[usize],
    rope: &Rope<T>,
    out: &mut [T],
) -> Result<(), KernelError> {
    shape.check()?;
    let GqaShape {
        batch,
        seq,
        heads,
        head_size: hs,
        ..
    } = *shape;
    q.check(batch * seq, heads, hs, "query")?;
    check_len("rotated query", out.len(), batch * seq * heads * hs)?;
    check_len("query starts", start.len(), batch)?;
    for b in 0..batch {
        let rope = rope.for_len(start[b] + seq);
        for s in 0..seq {
            let row = Positions::Start(start).row(b, s, seq, rope.rows())?;
            for h in 0..heads {
                let t = b * seq + s;
                rotate_one(
                    q.head(t, h, hs),
                    row,
                    &rope,
                    &mut out[(t * heads + h) * hs..][..hs],
                )?;
            }
        }
    }
    Ok(())
}
