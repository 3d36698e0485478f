//! Activation buffers: a free list of owned buffers reused by later values.

use oxgen_tensor::{AlignedBuf, DType, Shape, Tensor};

use crate::OpError;

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
    pub fn recycle(&mut self, tensor: Tensor) {
        if !tensor.is_shared() {
            let buf = tensor.into_buf();
            let at = self.free.partition_point(|b| b.capacity() < buf.capacity());
            self.free.insert(at, buf);
        }
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
