//! Which `MatMulNBits` layouts the fast int8 kernels take on this machine ([`supported`]);
//! the pure [`supported_on`] takes any feature table, so tests can ask what a capped machine
//! would run.

use super::layout::NBitsLayout;
use crate::cpu;
use crate::int8::runs_kernels;

/// Whether the fast kernels run this layout on this machine.
pub fn supported(layout: &NBitsLayout) -> bool {
    supported_on(layout, cpu::features())
}

/// Whether the fast kernels run this layout on a machine with features `f`.
pub fn supported_on(layout: &NBitsLayout, f: &cpu::Features) -> bool {
    (layout.bits == 4 || layout.bits == 8)
        && layout.block_size.is_multiple_of(32)
        && runs_kernels(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cpu::EVERYTHING;

    #[test]
    fn the_scalar_cap_leaves_every_layout_to_the_reference() {
        let layout = NBitsLayout::new(64, 576, 4, 32).unwrap();
        assert!(supported_on(&layout, &EVERYTHING));
        let scalar = EVERYTHING.capped(Some(cpu::Level::Scalar));
        assert_eq!(scalar.level, cpu::Level::Scalar);
        assert!(!supported_on(&layout, &scalar));
    }

    #[test]
    fn this_machine_takes_what_its_table_allows() {
        let layout = NBitsLayout::new(8, 64, 8, 32).unwrap();
        assert_eq!(supported(&layout), supported_on(&layout, cpu::features()));
    }
}
