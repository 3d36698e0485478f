//! The checks every paged call makes before it touches memory: segments against their block
//! tables, pool views against their layout, rotary tables against the positions written, and
//! a step's writes against each other. A call that passes them cannot index out of bounds or
//! write one place from two threads.

use smallvec::SmallVec;

use super::{MAX_HEAD_SIZE, PagedLayout, Segment};
use crate::error::KernelError;
use crate::rotary::Rope;

/// Checks that `segments` tile rows `0..tokens` in order and that every position they write
/// has a block of the pool.
pub(super) fn check_segments(
    layout: &PagedLayout,
    segments: &[Segment],
    tables: &[u32],
    tokens: usize,
) -> Result<(), KernelError> {
    let err = |i: usize, msg: String| Err(KernelError::Shape(format!("segment {i}: {msg}")));
    let mut next = 0;
    for (i, s) in segments.iter().enumerate() {
        if s.rows.start != next || s.rows.end < s.rows.start {
            return err(i, format!("rows {:?} do not follow row {next}", s.rows));
        }
        next = s.rows.end;
        let Some(table) = tables.get(s.table.clone()) else {
            return err(i, format!("block table {:?} is out of range", s.table));
        };
        let end = s.start.checked_add(s.rows.len());
        if end.is_none_or(|e| e > table.len().saturating_mul(layout.block_size)) {
            return err(
                i,
                format!(
                    "positions {}..{} do not fit in {} blocks of {}",
                    s.start,
                    s.start.saturating_add(s.rows.len()),
                    table.len(),
                    layout.block_size
                ),
            );
        }
        if let Some(&b) = table.iter().find(|&&b| b as usize >= layout.blocks) {
            return err(
                i,
                format!("block {b} is outside the pool of {}", layout.blocks),
            );
        }
    }
    if next != tokens {
        return Err(KernelError::Shape(format!(
            "the segments cover {next} rows of {tokens}"
        )));
    }
    Ok(())
}

/// Checks that a pool view of `len` elements holds `layout`'s blocks, and that its head
/// vectors start at multiples of the head size (where their scales are found).
pub(super) fn check_pool(
    layout: &PagedLayout,
    len: usize,
    what: &'static str,
) -> Result<(), KernelError> {
    let hs = layout.head_size;
    if hs > MAX_HEAD_SIZE || !layout.block_stride.is_multiple_of(hs.max(1)) {
        return Err(KernelError::Shape(format!(
            "{what}: head size {hs} must be at most {MAX_HEAD_SIZE} and divide the block stride {}",
            layout.block_stride
        )));
    }
    let want = layout
        .cache_len()
        .filter(|_| layout.block_stride >= layout.block_len())
        .ok_or_else(|| KernelError::Shape(format!("{layout:?} overflows or overlaps")))?;
    if len < want {
        return Err(KernelError::Length {
            what,
            expected: want,
            actual: len,
        });
    }
    Ok(())
}

/// Checks that `rope` rotates heads of `head_size` at every position `segments` write.
pub(super) fn check_rope<T>(
    rope: Option<&Rope<T>>,
    segments: &[Segment],
    head_size: usize,
) -> Result<(), KernelError> {
    let Some(rope) = rope else {
        return Ok(());
    };
    if 2 * rope.half > head_size {
        return Err(KernelError::Shape(format!(
            "rotary_dim {} exceeds the head size {head_size}",
            2 * rope.half
        )));
    }
    // Each sequence's last position against the caches it rotates with.
    match (segments.iter()).find(|s| s.end() > rope.for_len(s.end()).rows()) {
        Some(s) => Err(KernelError::Shape(format!(
            "position {} is out of range for cos/sin caches of {} rows",
            s.end() - 1,
            rope.for_len(s.end()).rows()
        ))),
        None => Ok(()),
    }
}

/// Checks that no two segments write one block, and that the key and value pools at
/// `k_at` and `v_at` of one store never overlap: the writes of a step's tokens then never
/// meet, whichever thread makes them.
pub(super) fn check_disjoint_writes(
    layout: &PagedLayout,
    (k_at, v_at): (usize, usize),
    segments: &[Segment],
    tables: &[u32],
) -> Result<(), KernelError> {
    if layout.blocks == 0 {
        return Ok(());
    }
    let bs = layout.block_size;
    let (len, stride) = (
        layout.block_len() as i128,
        layout.block_stride.max(1) as i128,
    );
    // Key block b starts at k_at + b * stride and value block b' at v_at + b' * stride; the
    // pools overlap when some distance d + j * stride (j = b' - b) is under a block. The
    // nearest such distances lie at the j around -d / stride.
    let (d, last) = (v_at as i128 - k_at as i128, layout.blocks as i128 - 1);
    let j = (-d).div_euclid(stride).clamp(-last, last);
    if [j, (j + 1).min(last)]
        .iter()
        .any(|&j| (d + j * stride).abs() < len)
    {
        return Err(KernelError::Shape(format!(
            "the key pool at {k_at} and the value pool at {v_at} overlap (blocks of {len} values every {stride})"
        )));
    }
    let mut written: SmallVec<[u32; 64]> = segments
        .iter()
        .flat_map(|s| {
            let table = &tables[s.table.clone()];
            let blocks = s.start / bs..(s.start + s.rows.len()).div_ceil(bs);
            table[blocks].iter().copied()
        })
        .collect();
    written.sort_unstable();
    match written.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(KernelError::Shape(format!(
            "block {} is written by two segments of one step",
            w[0]
        ))),
        None => Ok(()),
    }
}
