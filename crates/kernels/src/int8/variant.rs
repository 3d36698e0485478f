//! The variants of the int8 dot-product kernels ([`Variant`]: `MatMulNBits` and MXFP4 with
//! int8 activations) and which of them this machine runs. What the CPU has comes from the
//! crate's feature table ([`crate::cpu`], capped by `OXGEN_ISA`); this file only maps it onto
//! the variants. The pure [`Variant::available_on`] takes any table, so tests can ask what a
//! capped machine would run.

use std::sync::OnceLock;

use crate::cpu;

/// A variant of the int8 kernels: the instruction set its dot products use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Avx2,
    /// AVX2 with AVX-VNNI's `vpdpbusd`.
    AvxVnni,
    /// AVX-512 with VNNI: the packed kernel computes two tiles per 512-bit vector (the
    /// stored-layout kernel runs its 256-bit variant, [`Variant::ymm`]).
    Avx512Vnni,
}

impl Variant {
    /// Every variant this machine runs under the feature table, slowest first (computed
    /// once: kernels ask on every call, so this must not allocate).
    pub fn available() -> &'static [Variant] {
        static AVAILABLE: OnceLock<Vec<Variant>> = OnceLock::new();
        AVAILABLE.get_or_init(|| Variant::available_on(cpu::features()))
    }

    /// The variants a machine with features `f` runs, slowest first.
    pub fn available_on(f: &cpu::Features) -> Vec<Variant> {
        let mut isas = Vec::new();
        if runs_kernels(f) {
            isas.push(Variant::Avx2);
            if f.avxvnni {
                isas.push(Variant::AvxVnni);
            }
            if f.level >= cpu::Level::Avx512 && f.avx512bw && f.avx512vnni {
                isas.push(Variant::Avx512Vnni);
            }
        }
        isas
    }

    /// The fastest variant here, checked once. `OXGEN_ISA=avx2` keeps to 256-bit vectors and
    /// `OXGEN_ISA=novnni` to AVX2, to compare them (see [`crate::cpu`]).
    pub fn best() -> Variant {
        static BEST: OnceLock<Variant> = OnceLock::new();
        *BEST.get_or_init(|| Variant::best_of(Variant::available()))
    }

    /// The fastest of `available`; AVX2 when it is empty (callers check [`supported`]
    /// before they run any).
    pub fn best_of(available: &[Variant]) -> Variant {
        let has = |isa| available.contains(&isa);
        if has(Variant::Avx512Vnni) {
            Variant::Avx512Vnni
        } else if has(Variant::AvxVnni) {
            Variant::AvxVnni
        } else {
            Variant::Avx2
        }
    }

    /// The 256-bit variant to run where this one has none: AVX-VNNI where the CPU has it,
    /// else AVX2.
    pub fn ymm(self) -> Variant {
        match self {
            Variant::Avx512Vnni if Variant::available().contains(&Variant::AvxVnni) => {
                Variant::AvxVnni
            }
            Variant::Avx512Vnni => Variant::Avx2,
            other => other,
        }
    }
}

/// Whether `f` runs any variant: AVX2, with FMA for the kernels' epilogue and F16C for the
/// packed kernel's f16 scales (every AVX2 CPU but a few early VIA ones has both).
pub(crate) fn runs_kernels(f: &cpu::Features) -> bool {
    f.level >= cpu::Level::Avx2 && f.fma && f.f16c
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cpu::EVERYTHING;

    #[test]
    fn caps_and_switches_choose_the_variant() {
        let all = [Variant::Avx2, Variant::AvxVnni, Variant::Avx512Vnni];
        assert_eq!(Variant::available_on(&EVERYTHING), all);
        assert_eq!(Variant::best_of(&all), Variant::Avx512Vnni);
        let avx2 = EVERYTHING.capped(Some(cpu::Level::Avx2));
        assert_eq!(
            Variant::available_on(&avx2),
            [Variant::Avx2, Variant::AvxVnni]
        );
        assert_eq!(
            Variant::best_of(&Variant::available_on(&avx2)),
            Variant::AvxVnni
        );
        let scalar = EVERYTHING.capped(Some(cpu::Level::Scalar));
        assert_eq!(Variant::available_on(&scalar), []);
        let no_vnni = EVERYTHING.without_vnni();
        assert_eq!(Variant::available_on(&no_vnni), [Variant::Avx2]);
        assert_eq!(
            Variant::best_of(&Variant::available_on(&no_vnni)),
            Variant::Avx2
        );
        let no_f16c = cpu::Features {
            f16c: false,
            ..EVERYTHING
        };
        assert_eq!(Variant::available_on(&no_f16c), []);
    }

    #[test]
    fn this_machine_runs_what_its_table_allows() {
        assert_eq!(Variant::available(), Variant::available_on(cpu::features()));
        assert!(Variant::available().contains(&Variant::best()) || Variant::available().is_empty());
    }
}
