//! Rotary position embeddings (RoPE): rotate pairs of a head vector by position-dependent
//! angles read from precomputed cos/sin caches.
//!
//! For a head vector `x` of `head_size` elements, the first `rotary_dim = 2 * half` elements
//! are rotated and the rest are copied unchanged (partial rotary). Pair `i` (`0 <= i < half`)
//! is `(x[i], x[i + half])` ("half" layout, the default) or `(x[2i], x[2i + 1])`
//! (`interleaved`), and with `c = cos[pos, i]`, `s = sin[pos, i]`:
//!
//! ```text
//! x1' = x1 * c - x2 * s
//! x2' = x1 * s + x2 * c
//! ```
//!
//! Math runs in f32 (f16/bf16 widen exactly and round once per element). Each product is
//! rounded and the two are then added, which is bit-identical to onnxruntime's scalar CPU
//! kernel (`x[i] * cos + sign * x[j] * sin`) when it is compiled without FMA contraction.
//!
//! References: Su et al., "RoFormer" (arXiv:2104.09864); onnxruntime
//! `contrib_ops/cpu/bert/rotary_embedding.cc` and `docs/ContribOperators.md`
//! (com.microsoft::RotaryEmbedding); ONNX `RotaryEmbedding` (opset 23) reference code.

use crate::ThreadPool;
use crate::acc::Accum;
use crate::error::{KernelError, check_len};
use crate::par::{par_chunks, parts_for};

/// The cos/sin caches: `cos` and `sin` are `(rows, half)` row-major, `rotary_dim = 2 * half`.
#[derive(Debug, Clone, Copy)]
pub struct Rope<'a, T> {
    pub cos: &'a [T],
    pub sin: &'a [T],
    pub half: usize,
    pub interleaved: bool,
    /// LongRoPE's second pair of caches, chosen per sequence (see [`Rope::for_len`]).
    pub long: Option<LongCaches<'a, T>>,
}

/// LongRoPE (Phi-3.5, Phi-4-mini): caches made with the long factors, for a sequence that
/// holds more than `after` positions once the step is done (`original_max_position_embeddings`).
/// The choice is per sequence, from its own length, as onnxruntime-genai makes it for a
/// sequence run alone; positions index either pair from 0.
#[derive(Debug, Clone, Copy)]
pub struct LongCaches<'a, T> {
    pub after: usize,
    pub cos: &'a [T],
    pub sin: &'a [T],
}

impl<'a, T> Rope<'a, T> {
    /// Checks that `cos` and `sin` have the same whole number of rows of `half` elements.
    pub fn new(
        cos: &'a [T],
        sin: &'a [T],
        half: usize,
        interleaved: bool,
    ) -> Result<Self, KernelError> {
        if half == 0 || !cos.len().is_multiple_of(half) {
            return Err(KernelError::Shape(format!(
                "the cos cache ({} values) is not a whole number of rows of rotary_dim / 2 = {half}",
                cos.len()
            )));
        }
        check_len("sin cache", sin.len(), cos.len())?;
        Ok(Rope {
            cos,
            sin,
            half,
            interleaved,
            long: None,
        })
    }

    /// Adds LongRoPE's long caches (same row width), used by sequences longer than `after`.
    pub fn with_long(
        mut self,
        after: usize,
        cos: &'a [T],
        sin: &'a [T],
    ) -> Result<Self, KernelError> {
        let long = Rope::new(cos, sin, self.half, self.interleaved)?;
        self.long = Some(LongCaches {
            after,
            cos: long.cos,
            sin: long.sin,
        });
        Ok(self)
    }

    /// The caches a sequence that holds `len` positions after this step rotates with: the
    /// long ones past their threshold, else these.
    pub fn for_len(&self, len: usize) -> Rope<'a, T> {
        let (cos, sin) = match &self.long {
            Some(l) if len > l.after => (l.cos, l.sin),
            _ => (self.cos, self.sin),
        };
        Rope {
            cos,
            sin,
            half: self.half,
            interleaved: self.interleaved,
            long: None,
        }
    }

    /// Rows (positions) the caches hold.
    pub fn rows(&self) -> usize {
        self.cos.len() / self.half
    }
}

/// Rotates one head vector `x` at cache row `row` into `out` (same length, at least
/// `2 * rope.half`): the rotary part is rotated, the tail copied.
pub fn rotate_one<T: Accum<Acc = f32>>(
    x: &[T],
    row: usize,
    rope: &Rope<T>,
    out: &mut [T],
) -> Result<(), KernelError> {
    let half = rope.half;
    check_len("rotary output", out.len(), x.len())?;
    if x.len() < 2 * half {
        return Err(KernelError::Shape(format!(
            "rotary_dim {} exceeds the head size {}",
            2 * half,
            x.len()
        )));
    }
    if row >= rope.rows() {
        return Err(KernelError::Shape(format!(
            "position {row} is out of range for cos/sin caches of {} rows",
            rope.rows()
        )));
    }
    let cos = &rope.cos[row * half..][..half];
    let sin = &rope.sin[row * half..][..half];
    let turn = |x1: T, x2: T, c: T, s: T| {
        let (x1, x2, c, s) = (x1.widen(), x2.widen(), c.widen(), s.widen());
        (T::narrow(x1 * c - x2 * s), T::narrow(x1 * s + x2 * c))
    };
    if rope.interleaved {
        let pairs = out[..2 * half].chunks_exact_mut(2).zip(x.chunks_exact(2));
        for ((o, x), (&c, &s)) in pairs.zip(cos.iter().zip(sin)) {
            (o[0], o[1]) = turn(x[0], x[1], c, s);
        }
    } else {
        // Equal-length halves, so the loop has no bounds checks and vectorizes (the same
        // products and sums per element, no contraction: the same bits).
        let (x1, x2) = x[..2 * half].split_at(half);
        let (o1, o2) = out[..2 * half].split_at_mut(half);
        for i in 0..half {
            (o1[i], o2[i]) = turn(x1[i], x2[i], cos[i], sin[i]);
        }
    }
    out[2 * half..].copy_from_slice(&x[2 * half..]);
    Ok(())
}

/// Which cache row each token `(b, s)` reads.
#[derive(Debug, Clone, Copy)]
pub enum Positions<'a> {
    /// `offset + s` for every batch entry (com.microsoft::RotaryEmbedding, 1-element ids).
    Offset(i64),
    /// `ids[b * seq + s]` (position ids of shape `(batch, seq)`).
    Ids(&'a [i64]),
    /// `start[b] + s` (GroupQueryAttention: each entry continues from its past length).
    Start(&'a [usize]),
    /// `b * seq + s`: caches already gathered per token, shape `(batch, seq, half)`.
    PerToken,
}

impl Positions<'_> {
    /// The cache row of token `(b, s)`, checked against `rows`.
    pub fn row(&self, b: usize, s: usize, seq: usize, rows: usize) -> Result<usize, KernelError> {
        let pos: Option<i64> = match *self {
            Positions::Offset(o) => o.checked_add(s as i64),
            Positions::Ids(ids) => ids.get(b * seq + s).copied(),
            Positions::Start(start) => start
                .get(b)
                .and_then(|&p| p.checked_add(s))
                .and_then(|p| i64::try_from(p).ok()),
            Positions::PerToken => i64::try_from(b * seq + s).ok(),
        };
        match pos {
            Some(p) if p >= 0 && (p as u64) < rows as u64 => Ok(p as usize),
            Some(p) => Err(KernelError::Shape(format!(
                "position {p} of token (batch {b}, position {s}) is out of range for cos/sin caches of {rows} rows"
            ))),
            None => Err(KernelError::Shape(format!(
                "no position for token (batch {b}, position {s})"
            ))),
        }
    }
}

/// Layout of a tensor of head vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadsShape {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_size: usize,
    /// `(batch, heads, seq, head_size)` when set, else `(batch, seq, heads, head_size)`.
    pub heads_first: bool,
}

/// Applies RoPE to every head vector of `x` (laid out as `shape`) into `out`.
pub fn rotary<T: Accum<Acc = f32>>(
    x: &[T],
    shape: &HeadsShape,
    positions: Positions,
    rope: &Rope<T>,
    out: &mut [T],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let HeadsShape {
        batch,
        seq,
        heads,
        head_size,
        heads_first,
    } = *shape;
    let total = [batch, seq, heads, head_size]
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| KernelError::Shape(format!("{shape:?} overflows")))?;
    check_len("rotary input", x.len(), total)?;
    check_len("rotary output", out.len(), total)?;
    if let Positions::Ids(ids) = positions {
        check_len("position ids", ids.len(), batch * seq)?;
    }
    if total == 0 {
        return Ok(());
    }
    // Validate every position up front so the parallel part cannot fail half-way.
    for b in 0..batch {
        for s in 0..seq {
            positions.row(b, s, seq, rope.rows())?;
        }
    }
    let vectors = total / head_size;
    let parts = parts_for(pool, vectors, head_size);
    let per_part = vectors.div_ceil(parts) * head_size;
    par_chunks(pool, out, per_part, |start, part| {
        for (k, o) in part.chunks_mut(head_size).enumerate() {
            let v = start / head_size + k;
            let (b, s) = if heads_first {
                (v / (heads * seq), v % seq)
            } else {
                (v / (heads * seq), (v / heads) % seq)
            };
            let row = positions
                .row(b, s, seq, rope.rows())
                .expect("positions were validated above");
            rotate_one(&x[v * head_size..][..head_size], row, rope, o)
                .expect("lengths were validated above");
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    #[test]
    fn half_and_interleaved_pairs_rotate_and_the_tail_is_copied() {
        // head 6, rotary_dim 4 (half 2); one cache row with angles 90° and 0°.
        let (cos, sin) = ([0f32, 1.0], [1f32, 0.0]);
        let rope = Rope::new(&cos, &sin, 2, false).unwrap();
        let x = [1f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut out = [0f32; 6];
        rotate_one(&x, 0, &rope, &mut out).unwrap();
        // pair (x0, x2) by 90°: (-3, 1); pair (x1, x3) by 0°: (2, 4); tail copied.
        assert_eq!(out, [-3.0, 2.0, 1.0, 4.0, 5.0, 6.0]);
        let rope = Rope {
            interleaved: true,
            ..rope
        };
        rotate_one(&x, 0, &rope, &mut out).unwrap();
        // pair (x0, x1) by 90°: (-2, 1); pair (x2, x3) by 0°.
        assert_eq!(out, [-2.0, 1.0, 3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn layouts_positions_and_threads_agree() {
        let (batch, seq, heads, head_size) = (2, 5, 3, 16);
        let rows = 12;
        let half = 4;
        let cos: Vec<f32> = (0..rows * half).map(|i| (i as f32 * 0.37).cos()).collect();
        let sin: Vec<f32> = (0..rows * half).map(|i| (i as f32 * 0.37).sin()).collect();
        let rope = Rope::new(&cos, &sin, half, false).unwrap();
        let x: Vec<f32> = (0..batch * seq * heads * head_size)
            .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let bsnh = HeadsShape {
            batch,
            seq,
            heads,
            head_size,
            heads_first: false,
        };
        let run = |shape: &HeadsShape, x: &[f32], pos: Positions, threads| {
            let mut out = vec![0f32; x.len()];
            rotary(x, shape, pos, &rope, &mut out, &ThreadPool::new(threads)).unwrap();
            out
        };
        let a = run(&bsnh, &x, Positions::Offset(3), 1);
        let b = run(&bsnh, &x, Positions::Start(&[3, 3]), 3);
        let ids: Vec<i64> = (0..batch * seq).map(|t| 3 + (t % seq) as i64).collect();
        let c = run(&bsnh, &x, Positions::Ids(&ids), 2);
        assert!(
            a.iter()
                .zip(&b)
                .chain(a.iter().zip(&c))
                .all(|(p, q)| p.to_bits() == q.to_bits())
        );
        // The same data transposed to (batch, heads, seq, head) rotates the same way.
        let to_bnsh = |v: &[f32]| {
            let mut t = vec![0f32; v.len()];
            for bb in 0..batch {
                for s in 0..seq {
                    for n in 0..heads {
                        let src = ((bb * seq + s) * heads + n) * head_size;
                        let dst = ((bb * heads + n) * seq + s) * head_size;
                        t[dst..dst + head_size].copy_from_slice(&v[src..src + head_size]);
                    }
                }
            }
            t
        };
        let bnsh = HeadsShape {
            heads_first: true,
            ..bsnh
        };
        assert_eq!(
            run(&bnsh, &to_bnsh(&x), Positions::Offset(3), 3),
            to_bnsh(&a)
        );
        let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
        let (hc, hs): (Vec<f16>, Vec<f16>) = (
            cos.iter().map(|&v| f16::from_f32(v)).collect(),
            sin.iter().map(|&v| f16::from_f32(v)).collect(),
        );
        let hrope = Rope::new(&hc, &hs, half, true).unwrap();
        let mut ho = vec![f16::ZERO; h.len()];
        rotary(
            &h,
            &bsnh,
            Positions::Offset(0),
            &hrope,
            &mut ho,
            &ThreadPool::new(1),
        )
        .unwrap();
        assert_eq!(ho[8..16], h[8..16], "the tail beyond rotary_dim is copied");
    }

    #[test]
    fn out_of_range_positions_are_errors() {
        let (cos, sin) = ([1f32; 8], [0f32; 8]);
        let rope = Rope::new(&cos, &sin, 4, false).unwrap();
        let shape = HeadsShape {
            batch: 1,
            seq: 2,
            heads: 1,
            head_size: 8,
            heads_first: false,
        };
        let x = [0f32; 16];
        let mut out = [0f32; 16];
        let pool = ThreadPool::new(1);
        assert!(rotary(&x, &shape, Positions::Offset(1), &rope, &mut out, &pool).is_err());
        assert!(rotary(&x, &shape, Positions::Ids(&[0, -1]), &rope, &mut out, &pool).is_err());
        assert!(rotary(&x, &shape, Positions::Offset(0), &rope, &mut out, &pool).is_ok());
        assert!(Rope::new(&cos[..7], &sin[..7], 4, false).is_err());
    }
}
