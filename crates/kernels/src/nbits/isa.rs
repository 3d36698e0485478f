//! The variants of the fast int8 `MatMulNBits` kernels ([`Isa`]), which of them this machine
//! runs, and which layouts they take ([`supported`]). What the CPU has comes from the crate's
//! feature table ([`crate::cpu`], capped by `OXGEN_ISA`); this file only maps it onto the
//! variants. The pure [`Isa::available_on`] and [`supported_on`] take any table, so tests can
//! ask what a capped machine would run.

use std::sync::OnceLock;

use super::layout::NBitsLayout;
use crate::cpu;

/// The instruction sets the fast kernels have variants for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Avx2,
    /// AVX2 with AVX-VNNI's `vpdpbusd`.
    AvxVnni,
    /// AVX-512 with VNNI: the packed kernel computes two tiles per 512-bit vector (the
    /// stored-layout kernel runs its 256-bit variant, [`Isa::ymm`]).
    Avx512Vnni,
}

impl Isa {
    /// Every variant this machine runs under the feature table, slowest first (computed
    /// once: kernels ask on every call, so this must not allocate).
    pub fn available() -> &'static [Isa] {
        static AVAILABLE: OnceLock<Vec<Isa>> = OnceLock::new();
        AVAILABLE.get_or_init(|| Isa::available_on(cpu::features()))
    }

    /// The variants a machine with features `f` runs, slowest first.
    pub fn available_on(f: &cpu::Features) -> Vec<Isa> {
        let mut isas = Vec::new();
        if runs_kernels(f) {
            isas.push(Isa::Avx2);
            if f.avxvnni {
                isas.push(Isa::AvxVnni);
            }
            if f.isa >= cpu::Isa::Avx512 && f.avx512bw && f.avx512vnni {
                isas.push(Isa::Avx512Vnni);
            }
        }
        isas
    }

    /// The fastest variant here, checked once. `OXGEN_ISA=avx2` (or `OXGEN_NO_AVX512`) keeps
    /// to 256-bit vectors and `OXGEN_NO_VNNI` to AVX2, to compare them (see [`crate::cpu`]).
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| Isa::best_of(Isa::available()))
    }

    /// The fastest of `available`; AVX2 when it is empty (callers check [`supported`]
    /// before they run any).
    pub fn best_of(available: &[Isa]) -> Isa {
        let has = |isa| available.contains(&isa);
        if has(Isa::Avx512Vnni) {
            Isa::Avx512Vnni
        } else if has(Isa::AvxVnni) {
            Isa::AvxVnni
        } else {
            Isa::Avx2
        }
    }

    /// The 256-bit variant to run where this one has none: AVX-VNNI where the CPU has it,
    /// else AVX2.
    pub fn ymm(self) -> Isa {
        match self {
            Isa::Avx512Vnni if Isa::available().contains(&Isa::AvxVnni) => Isa::AvxVnni,
            Isa::Avx512Vnni => Isa::Avx2,
            other => other,
        }
    }
}

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

/// Whether `f` runs any variant: AVX2, with FMA for the kernels' epilogue and F16C for the
/// packed kernel's f16 scales (every AVX2 CPU but a few early VIA ones has both).
fn runs_kernels(f: &cpu::Features) -> bool {
    f.isa >= cpu::Isa::Avx2 && f.fma && f.f16c
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cpu::EVERYTHING;

    #[test]
    fn the_scalar_cap_leaves_every_layout_to_the_reference() {
        let layout = NBitsLayout::new(64, 576, 4, 32).unwrap();
        assert!(supported_on(&layout, &EVERYTHING));
        let scalar = EVERYTHING.capped(cpu::parse_cap("scalar"));
        assert_eq!(scalar.isa, cpu::Isa::Scalar);
        assert_eq!(Isa::available_on(&scalar), []);
        assert!(!supported_on(&layout, &scalar));
    }

    #[test]
    fn caps_and_switches_choose_the_variant() {
        let all = [Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni];
        assert_eq!(Isa::available_on(&EVERYTHING), all);
        assert_eq!(Isa::best_of(&all), Isa::Avx512Vnni);
        let avx2 = EVERYTHING.capped(cpu::parse_cap("avx2"));
        assert_eq!(Isa::available_on(&avx2), [Isa::Avx2, Isa::AvxVnni]);
        assert_eq!(Isa::best_of(&Isa::available_on(&avx2)), Isa::AvxVnni);
        let no_vnni = EVERYTHING.without_vnni();
        assert_eq!(Isa::available_on(&no_vnni), [Isa::Avx2]);
        assert_eq!(Isa::best_of(&Isa::available_on(&no_vnni)), Isa::Avx2);
        let no_f16c = cpu::Features {
            f16c: false,
            ..EVERYTHING
        };
        assert_eq!(Isa::available_on(&no_f16c), []);
    }

    #[test]
    fn this_machine_runs_what_its_table_allows() {
        let layout = NBitsLayout::new(8, 64, 8, 32).unwrap();
        assert_eq!(Isa::available(), Isa::available_on(cpu::features()));
        assert_eq!(supported(&layout), supported_on(&layout, cpu::features()));
        assert!(Isa::available().contains(&Isa::best()) || Isa::available().is_empty());
    }
}
