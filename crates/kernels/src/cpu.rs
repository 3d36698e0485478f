//! The CPU feature table: which SIMD extensions this machine has, detected once at first use,
//! and the one place every SIMD entry point of the crate asks before it leaves the scalar
//! reference (no kernel calls `is_x86_feature_detected!` itself).
//!
//! [`isa`] gives the vector level, [`Isa::Scalar`] < [`Isa::Avx2`] < [`Isa::Avx512`] (AVX-512
//! F and VL on top of AVX2); [`features`] adds the finer flags the kernels need beside it (FMA and
//! F16C next to AVX2; AVX-VNNI; AVX-512 BW and VNNI). A flag is only ever set together with
//! the level it extends, so `isa() >= Isa::Avx2 && features().fma` is all a caller checks.
//!
//! # Capping the level
//!
//! `OXGEN_ISA=scalar|avx2|avx512` (any case) caps the level, for tests and bug reports:
//! `scalar` sends every entry point down its reference path, `avx2` turns the AVX-512 paths
//! off. A cap never raises the level above what the CPU has ([`Features::capped`]). Any other
//! value is ignored, with one warning line on stderr, rather than failing a run over a typo:
//! the kernels then use everything the CPU has. Two older switches are read here too:
//! `OXGEN_NO_AVX512` (set to anything) caps the level at AVX2 like `OXGEN_ISA=avx2`, and
//! `OXGEN_NO_VNNI` (set to anything) clears the VNNI flags, so the int8 `MatMulNBits`
//! kernels run on plain AVX2 (`docs/PERFORMANCE.md` compares them so). Every path gives the
//! same bits as its reference, so a cap changes speed, never results.
//!
//! The environment is read once, with the detection; a test that needs another cap calls
//! the pure [`parse_cap`] and [`Features::capped`] instead of changing the environment.

use std::sync::OnceLock;

/// A vector level, ordered: a cap or a requirement compares with `<` and `min`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// No SIMD: the scalar references.
    Scalar,
    /// AVX2 (256-bit integer and float vectors).
    Avx2,
    /// AVX-512 F and VL on top of AVX2 (VL: the 32 vector registers at 256 bits too).
    Avx512,
}

/// What the kernels may use on this machine: a vector level and the finer flags beside it.
/// Each flag is false unless `isa` reaches the level it extends (see [`Features::capped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    pub isa: Isa,
    /// Fused multiply-add on 256-bit vectors (with AVX2).
    pub fma: bool,
    /// f16 ↔ f32 conversion on vectors (with AVX2).
    pub f16c: bool,
    /// AVX-VNNI's 256-bit `vpdpbusd` (with AVX2).
    pub avxvnni: bool,
    /// AVX-512 BW (with AVX-512).
    pub avx512bw: bool,
    /// AVX-512 VNNI (with AVX-512).
    pub avx512vnni: bool,
}

impl Features {
    /// The scalar machine: no SIMD at all.
    pub const SCALAR: Features = Features {
        isa: Isa::Scalar,
        fma: false,
        f16c: false,
        avxvnni: false,
        avx512bw: false,
        avx512vnni: false,
    };

    /// What the CPU has, uncapped (asks the CPU; [`features`] caches the result).
    pub fn detect() -> Features {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let isa = if has!("avx2") && has!("avx512f") && has!("avx512vl") {
                Isa::Avx512
            } else if has!("avx2") {
                Isa::Avx2
            } else {
                Isa::Scalar
            };
            Features {
                isa,
                fma: has!("fma"),
                f16c: has!("f16c"),
                avxvnni: has!("avxvnni"),
                avx512bw: has!("avx512bw"),
                avx512vnni: has!("avx512vnni"),
            }
            // Flags of a level the CPU lacks are cleared by the same rule as a cap's.
            .capped(None)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Features::SCALAR
        }
    }

    /// These features with the level lowered to `cap` where `cap` is lower (never raised),
    /// and every flag of a level above the result cleared.
    pub fn capped(self, cap: Option<Isa>) -> Features {
        let isa = cap.map_or(self.isa, |cap| self.isa.min(cap));
        let avx2 = isa >= Isa::Avx2;
        let avx512 = isa >= Isa::Avx512;
        Features {
            isa,
            fma: self.fma && avx2,
            f16c: self.f16c && avx2,
            avxvnni: self.avxvnni && avx2,
            avx512bw: self.avx512bw && avx512,
            avx512vnni: self.avx512vnni && avx512,
        }
    }

    /// These features without the VNNI flags (`OXGEN_NO_VNNI`).
    pub fn without_vnni(self) -> Features {
        Features {
            avxvnni: false,
            avx512vnni: false,
            ..self
        }
    }

    /// AVX2 with FMA: the float kernels' 256-bit level.
    pub fn avx2_fma(&self) -> bool {
        self.isa >= Isa::Avx2 && self.fma
    }
}

/// The level an `OXGEN_ISA` value names (`scalar`, `avx2` or `avx512`, any case, surrounding
/// blanks ignored); `None` for anything else.
pub fn parse_cap(value: &str) -> Option<Isa> {
    match value.trim().to_ascii_lowercase().as_str() {
        "scalar" => Some(Isa::Scalar),
        "avx2" => Some(Isa::Avx2),
        "avx512" => Some(Isa::Avx512),
        _ => None,
    }
}

/// The table: what the CPU has, the cap the environment set, and what the kernels use.
struct Table {
    cap: Option<Isa>,
    features: Features,
}

#[inline]
fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        let isa_cap = std::env::var("OXGEN_ISA").ok().and_then(|v| {
            let cap = parse_cap(&v);
            if cap.is_none() && !v.trim().is_empty() {
                eprintln!(
                    "oxgen: ignoring OXGEN_ISA={v:?} (expected scalar, avx2 or avx512); \
                     using every feature the CPU has"
                );
            }
            cap
        });
        let set = |var: &str| std::env::var_os(var).is_some();
        let no_avx512 = set("OXGEN_NO_AVX512").then_some(Isa::Avx2);
        let cap = match (isa_cap, no_avx512) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut features = Features::detect().capped(cap);
        if set("OXGEN_NO_VNNI") {
            features = features.without_vnni();
        }
        Table { cap, features }
    })
}

/// What the kernels may use here: the detected features under the environment's cap (see
/// the module doc). Detected once; later calls are one load.
#[inline]
pub fn features() -> &'static Features {
    &table().features
}

/// The vector level the kernels may use here: `features().isa`.
#[inline]
pub fn isa() -> Isa {
    features().isa
}

/// The cap the environment set (`OXGEN_ISA`, or AVX2 for `OXGEN_NO_AVX512`), if any.
pub fn cap() -> Option<Isa> {
    table().cap
}

/// A CPU with every feature the table knows, for tests of capping and choosing.
#[cfg(test)]
pub(crate) const EVERYTHING: Features = Features {
    isa: Isa::Avx512,
    fma: true,
    f16c: true,
    avxvnni: true,
    avx512bw: true,
    avx512vnni: true,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_parse_in_any_case_and_unknown_values_are_none() {
        assert_eq!(parse_cap("scalar"), Some(Isa::Scalar));
        assert_eq!(parse_cap("AVX2"), Some(Isa::Avx2));
        assert_eq!(parse_cap(" avx512\n"), Some(Isa::Avx512));
        for bad in ["", "sse", "avx", "avx-512", "neon", "1"] {
            assert_eq!(parse_cap(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_cap_lowers_the_level_and_clears_the_flags_above_it() {
        assert_eq!(EVERYTHING.capped(None), EVERYTHING);
        assert_eq!(EVERYTHING.capped(Some(Isa::Avx512)), EVERYTHING);
        let avx2 = EVERYTHING.capped(Some(Isa::Avx2));
        assert_eq!(
            avx2,
            Features {
                isa: Isa::Avx2,
                avx512bw: false,
                avx512vnni: false,
                ..EVERYTHING
            }
        );
        assert!(avx2.avx2_fma());
        assert_eq!(EVERYTHING.capped(Some(Isa::Scalar)), Features::SCALAR);
        assert!(!Features::SCALAR.avx2_fma());
    }

    #[test]
    fn a_cap_never_raises_the_level() {
        let avx2_only = EVERYTHING.capped(Some(Isa::Avx2));
        assert_eq!(avx2_only.capped(Some(Isa::Avx512)), avx2_only);
        assert_eq!(Features::SCALAR.capped(Some(Isa::Avx512)), Features::SCALAR);
        // Flags the CPU reports without their level stay off.
        let odd = Features {
            isa: Isa::Scalar,
            ..EVERYTHING
        };
        assert_eq!(odd.capped(None), Features::SCALAR);
    }

    #[test]
    fn the_table_is_the_detection_under_the_cap() {
        let detected = Features::detect();
        let f = *features();
        assert!(f.isa <= detected.isa);
        assert!(cap().is_none_or(|c| f.isa <= c));
        for (used, has) in [
            (f.fma, detected.fma),
            (f.f16c, detected.f16c),
            (f.avxvnni, detected.avxvnni),
            (f.avx512bw, detected.avx512bw),
            (f.avx512vnni, detected.avx512vnni),
        ] {
            assert!(!used || has, "a flag the CPU lacks: {f:?} vs {detected:?}");
        }
        assert_eq!(isa(), f.isa);
    }
}
