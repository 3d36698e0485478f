//! Tensor shapes: a small inline list of dimensions.

use smallvec::SmallVec;

/// Dimensions of a tensor, outermost first. Rank 0 is a scalar with one element.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(SmallVec<[usize; 6]>);

impl Shape {
    pub fn new(dims: &[usize]) -> Self {
        Shape(SmallVec::from_slice(dims))
    }

    pub fn scalar() -> Self {
        Shape(SmallVec::new())
    }

    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    pub fn dims_mut(&mut self) -> &mut [usize] {
        &mut self.0
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements. Shapes inside a [`crate::Tensor`] are checked at construction, so
    /// this cannot overflow for them; use [`checked_numel`] on untrusted dimensions.
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> SmallVec<[usize; 6]> {
        let mut strides = SmallVec::from_elem(1, self.rank());
        for i in (0..self.rank().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.0[i + 1];
        }
        strides
    }

    pub fn push(&mut self, dim: usize) {
        self.0.push(dim);
    }
}

/// The element count of `dims`, or `None` when it overflows `usize`.
pub fn checked_numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Self {
        Shape::new(dims)
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Shape::new(&dims)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Self {
        Shape(SmallVec::from_vec(dims))
    }
}

impl From<SmallVec<[usize; 8]>> for Shape {
    fn from(dims: SmallVec<[usize; 8]>) -> Self {
        Shape(SmallVec::from_slice(&dims))
    }
}

impl FromIterator<usize> for Shape {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        Shape(iter.into_iter().collect())
    }
}

impl std::ops::Index<usize> for Shape {
    type Output = usize;
    fn index(&self, i: usize) -> &usize {
        &self.0[i]
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl std::fmt::Debug for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// One dimension of a declared input or output shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Fixed(usize),
    /// A named dimension such as `batch_size` or `sequence_length`.
    Symbolic(String),
    Unknown,
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Fixed(d) => write!(f, "{d}"),
            Dim::Symbolic(s) => f.write_str(s),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_are_row_major() {
        assert_eq!(Shape::from([2, 3, 4]).strides().as_slice(), &[12, 4, 1]);
        assert_eq!(Shape::scalar().numel(), 1);
        assert_eq!(Shape::from([2, 0]).numel(), 0);
    }

    #[test]
    fn checked_numel_catches_overflow() {
        assert_eq!(checked_numel(&[usize::MAX, 2]), None);
        assert_eq!(checked_numel(&[3, 5]), Some(15));
    }
}
