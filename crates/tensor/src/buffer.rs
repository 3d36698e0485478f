//! A growable byte buffer aligned to [`AlignedBuf::ALIGN`] bytes, so any element type (and
//! any SIMD width up to AVX-512) can view it without a misaligned load.

/// One cache line; the unit of allocation.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

// SAFETY: `Line` is 64 bytes of `u8` with alignment 64, so it has no padding and every bit
// pattern is valid.
unsafe impl bytemuck::Zeroable for Line {}
unsafe impl bytemuck::Pod for Line {}

/// Owned, zero-initialised, 64-byte aligned bytes.
#[derive(Clone, Default)]
pub struct AlignedBuf {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBuf {
    /// Alignment of the first byte.
    pub const ALIGN: usize = 64;

    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        AlignedBuf {
            lines: vec![Line([0; 64]); len.div_ceil(Self::ALIGN)],
            len,
        }
    }

    /// A copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let mut buf = Self::zeroed(bytes.len());
        buf.as_mut_bytes().copy_from_slice(bytes);
        buf
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the allocation can hold without growing.
    pub fn capacity(&self) -> usize {
        self.lines.len() * Self::ALIGN
    }

    /// Sets the length to `len` bytes, growing (with zeros) only when the capacity is short.
    /// Bytes kept from earlier use are not cleared.
    pub fn resize(&mut self, len: usize) {
        self.try_resize(len)
            .expect("allocating an activation buffer");
    }

    /// Like [`AlignedBuf::resize`], but reports an allocation the system refuses instead of
    /// aborting, for sizes that come from untrusted data.
    pub fn try_resize(&mut self, len: usize) -> Result<(), std::collections::TryReserveError> {
        let lines = len.div_ceil(Self::ALIGN);
        if lines > self.lines.len() {
            self.lines.try_reserve_exact(lines - self.lines.len())?;
            self.lines.resize(lines, Line([0; 64]));
        }
        self.len = len;
        Ok(())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<Line, u8>(&self.lines)[..self.len]
    }

    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<Line, u8>(&mut self.lines)[..self.len]
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}
