//! The arguments of an attention call: its sizes ([`GqaShape`]), how scores are formed and
//! masked ([`ScoreMod`]), and where the new tokens' head vectors lie ([`Rows`]).

use crate::error::KernelError;

/// Sizes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GqaShape {
    pub batch: usize,
    /// Query rows per batch entry (S).
    pub seq: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_size: usize,
    /// Positions the caches hold per (batch, kv head).
    pub capacity: usize,
}

impl GqaShape {
    pub(super) fn check(&self) -> Result<(), KernelError> {
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(KernelError::Shape(format!(
                "num_heads {} is not a multiple of kv_num_heads {}",
                self.heads, self.kv_heads
            )));
        }
        let dims = [
            self.batch,
            self.seq,
            self.heads.max(self.kv_heads),
            self.head_size,
            self.capacity,
        ];
        dims.iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d.max(1)))
            .map(|_| ())
            .ok_or_else(|| KernelError::Shape(format!("{self:?} overflows")))
    }

    pub(super) fn cache_len(&self) -> usize {
        self.batch * self.kv_heads * self.capacity * self.head_size
    }
}

/// How scores are formed and masked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreMod<'a> {
    /// Multiplies `q · k`.
    pub scale: f32,
    /// `softcap * tanh(x / softcap)` on scaled scores when positive; 0 turns it off.
    pub softcap: f32,
    /// Keys a query sees, itself included: positions `p + 1 - window ..= p`.
    pub window: Option<usize>,
    /// Attention sinks (GroupQueryAttention's `head_sink`, gpt-oss): one logit per query head
    /// that joins the softmax's max and denominator but has no value (taken as is, neither
    /// scaled nor capped).
    pub sinks: Option<&'a [f32]>,
}

impl ScoreMod<'_> {
    pub(super) fn check(&self, heads: usize) -> Result<(), KernelError> {
        match self.sinks {
            Some(s) if s.len() != heads => Err(KernelError::Shape(format!(
                "{} attention sinks for {heads} query heads: one per head",
                s.len()
            ))),
            _ => Ok(()),
        }
    }
}

/// Head vectors of new tokens inside wider rows: head `h` of token `t = b * seq + s` starts at
/// `offset + t * stride + h * head_size`. Covers plain `(batch, seq, heads * head_size)`
/// tensors (`offset` 0, `stride` = heads * head_size) and slices of packed QKV rows.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a, T> {
    pub data: &'a [T],
    pub stride: usize,
    pub offset: usize,
}

impl<T> Rows<'_, T> {
    /// Checks that `tokens` rows of `heads` heads lie inside `data`.
    pub(crate) fn check(
        &self,
        tokens: usize,
        heads: usize,
        head_size: usize,
        what: &str,
    ) -> Result<(), KernelError> {
        if tokens == 0 || heads * head_size == 0 {
            return Ok(());
        }
        let end = (tokens - 1)
            .checked_mul(self.stride)
            .and_then(|v| v.checked_add(self.offset))
            .and_then(|v| v.checked_add(heads * head_size));
        match end {
            Some(end) if end <= self.data.len() => Ok(()),
            _ => Err(KernelError::Shape(format!(
                "{what}: {tokens} rows of {heads} heads x {head_size} at offset {} stride {} do not fit in {} values",
                self.offset,
                self.stride,
                self.data.len()
            ))),
        }
    }

    pub(crate) fn head(&self, token: usize, h: usize, head_size: usize) -> &[T] {
        &self.data[self.offset + token * self.stride + h * head_size..][..head_size]
    }
}
