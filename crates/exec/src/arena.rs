//! Activation buffers: a free list of owned buffers reused by later values.

use oxgen_tensor::{AlignedBuf, DType, Shape, Tensor};

use crate::OpError;

/// Free buffers an arena keeps at most. A run gets back every buffer it took from the arena,
/// so the list settles at the most values a run holds at once (9 for the default model's
/// decode step); but outputs ops build outside the arena (a quantizer's scale and zero point,
/// a shape) arrive as new buffers every run, and without a bound the list grew by them run
/// after run: an int8 MiniLM's by 50 a sentence, 20,000 buffers after 400 sentences (RSS +14
/// MiB over 1,600), each release moving the list to insert.
const MAX_FREE: usize = 256;

/// Buffers released by dead values (smallest first), handed out again by best fit.
#[derive(Default)]
pub struct Arena {
    free: Vec<AlignedBuf>,
    live_bytes: usize,
    peak_bytes: usize,
}

impl Arena {
    /// A tensor of `dtype` and `shape`. Its bytes may hold data from an earlier value: the
    /// caller writes every element.
    pub fn alloc(&mut self, dtype: DType, shape: impl Into<Shape>) -> Result<Tensor, OpError> {
        let shape = shape.into();
        let bytes = oxgen_tensor::checked_numel(shape.dims())
            .and_then(|n| dtype.bytes_for(n))
            .ok_or_else(|| OpError::shape(format!("output shape {shape} of {dtype} overflows")))?;
        // The smallest buffer that holds it, else the largest grown: a run's buffers stay as
        // many as its values live at once, however their sizes change from run to run.
        let fit = self.free.partition_point(|b| b.capacity() < bytes);
        let mut buf = match self.free.len() {
            0 => AlignedBuf::zeroed(0),
            len => self.free.remove(fit.min(len - 1)),
        };
        buf.try_resize(bytes).map_err(|_| {
            OpError::shape(format!("cannot allocate {bytes} bytes for an output of shape {shape} ({dtype}): out of memory"))
        })?;
        Ok(Tensor::from_buf(dtype, shape, buf)?)
    }

    /// Like [`Arena::alloc`], with every byte zero.
    pub fn alloc_zeroed(
        &mut self,
        dtype: DType,
        shape: impl Into<Shape>,
    ) -> Result<Tensor, OpError> {
        let mut t = self.alloc(dtype, shape)?;
        t.as_mut_bytes().fill(0);
        Ok(t)
    }

    /// Counts a node output as live.
    pub fn track(&mut self, bytes: usize) {
        self.live_bytes += bytes;
        self.peak_bytes = self.peak_bytes.max(self.live_bytes);
    }

    /// Returns a dead node output's buffer to the free list.
    pub fn release(&mut self, tensor: Tensor) {
        self.forget(&tensor);
        self.recycle(tensor);
    }

    /// Keeps the buffer of a tensor that was never counted live (a graph input) for reuse.
    /// A full free list ([`MAX_FREE`]) keeps its largest buffers: the smallest is dropped.
    pub fn recycle(&mut self, tensor: Tensor) {
        if tensor.is_shared() {
            return;
        }
        let buf = tensor.into_buf();
        let at = self.free.partition_point(|b| b.capacity() < buf.capacity());
        match self.free.len() < MAX_FREE {
            true => self.free.insert(at, buf),
            false if at == 0 => drop(buf),
            false => {
                self.free.remove(0);
                self.free.insert(at - 1, buf);
            }
        }
    }

    /// Buffers held for reuse.
    pub fn free_buffers(&self) -> usize {
        self.free.len()
    }

    /// Forgets a value that leaves the arena (a graph output handed to the caller).
    pub fn forget(&mut self, tensor: &Tensor) {
        self.live_bytes = self.live_bytes.saturating_sub(tensor.nbytes());
    }

    /// Starts a new run's peak measurement.
    pub fn reset_peak(&mut self) {
        self.live_bytes = 0;
        self.peak_bytes = 0;
    }

    pub fn peak_bytes(&self) -> usize {
        self.peak_bytes
    }

    /// Bytes held by free buffers.
    pub fn free_bytes(&self) -> usize {
        self.free.iter().map(|b| b.capacity()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers that never came from the arena (each run's small op outputs) do not pile up:
    /// a full list drops its smallest, and keeps the large ones a run reuses.
    #[test]
    fn the_free_list_is_bounded_and_keeps_its_largest_buffers() {
        let mut arena = Arena::default();
        let big = arena.alloc(DType::F32, [1 << 16]).unwrap();
        arena.release(big);
        for i in 0..(MAX_FREE * 8) {
            arena.recycle(Tensor::from_slice([1usize].as_slice(), &[i as f32]).unwrap());
        }
        assert_eq!(arena.free_buffers(), MAX_FREE);
        // The large buffer is still there: a large request is served from it.
        let before = arena.free_bytes();
        let again = arena.alloc(DType::F32, [1 << 16]).unwrap();
        assert_eq!(
            arena.free_bytes(),
            before - again.nbytes().next_multiple_of(64)
        );
    }
}
