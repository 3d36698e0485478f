//! The CPU feature table: which SIMD extensions this machine has, detected once at first use,
//! and the one place every SIMD entry point of the crate asks before it leaves the scalar
//! reference (no kernel calls `is_x86_feature_detected!` itself).
//!
//! [`level`] gives the vector level ([`Level`]: [`Level::Scalar`] < [`Level::Avx2`] <
//! [`Level::Avx512`], AVX-512 F and VL on top of AVX2); [`features`] adds the finer flags the
//! kernels need beside it (FMA and F16C next to AVX2; AVX-VNNI; AVX-512 BW and VNNI). A flag is
//! only ever set together with the level it extends, so `level() >= Level::Avx2 &&
//! features().fma` is all a caller checks. (Which variant of a kernel runs on these features
//! is the kernel family's call: [`crate::int8::Variant`] for the int8 dot products.)
//!
//! # Capping
//!
//! One switch, `OXGEN_ISA`, caps what the kernels use, for comparisons, tests and bug
//! reports. Its value is a level, `novnni`, or both joined by a comma (any case:
//! `OXGEN_ISA=avx512,novnni`): `scalar` sends every entry point down its reference path,
//! `avx2` turns the AVX-512 paths off, `novnni` clears the VNNI flags so the int8 kernels run
//! on plain AVX2 or AVX-512 BW arithmetic (`docs/PERFORMANCE.md` compares them so). A cap
//! never raises the level above what the CPU has ([`Features::capped`]). A value with any
//! other word is ignored, with one warning line on stderr, rather than failing a run over a
//! typo: the kernels then use everything the CPU has. Every path gives the same bits as its
//! reference, so a cap changes speed, never results.
//!
//! The environment is read once, with the detection; a test that needs another cap calls
//! the pure [`parse_cap`] and [`Features::under`] instead of changing the environment.

use std::sync::OnceLock;

/// A vector level, ordered: a cap or a requirement compares with `<` and `min`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// No SIMD: the scalar references.
    Scalar,
    /// AVX2 (256-bit integer and float vectors).
    Avx2,
    /// AVX-512 F and VL on top of AVX2 (VL: the 32 vector registers at 256 bits too).
    Avx512,
}

/// What the kernels may use on this machine: a vector level and the finer flags beside it.
/// Each flag is false unless `level` reaches the level it extends (see [`Features::capped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    pub level: Level,
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
        level: Level::Scalar,
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
            let level = if has!("avx2") && has!("avx512f") && has!("avx512vl") {
                Level::Avx512
            } else if has!("avx2") {
                Level::Avx2
            } else {
                Level::Scalar
            };
            Features {
                level,
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
    pub fn capped(self, cap: Option<Level>) -> Features {
        let level = cap.map_or(self.level, |cap| self.level.min(cap));
        let avx2 = level >= Level::Avx2;
        let avx512 = level >= Level::Avx512;
        Features {
            level,
            fma: self.fma && avx2,
            f16c: self.f16c && avx2,
            avxvnni: self.avxvnni && avx2,
            avx512bw: self.avx512bw && avx512,
            avx512vnni: self.avx512vnni && avx512,
        }
    }

    /// These features without the VNNI flags (`OXGEN_ISA=novnni`).
    pub fn without_vnni(self) -> Features {
        Features {
            avxvnni: false,
            avx512vnni: false,
            ..self
        }
    }

    /// AVX2 with FMA: the float kernels' 256-bit level.
    pub fn avx2_fma(&self) -> bool {
        self.level >= Level::Avx2 && self.fma
    }
}

/// What an `OXGEN_ISA` value asks for: a cap on the level, and the VNNI flags cleared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cap {
    pub level: Option<Level>,
    pub no_vnni: bool,
}

/// The cap an `OXGEN_ISA` value names: words `scalar`, `avx2`, `avx512` (a level, the lowest
/// named counts) and `novnni`, joined by commas, any case, blanks ignored; `None` when a word
/// is none of them (or there is none).
pub fn parse_cap(value: &str) -> Option<Cap> {
    let mut cap = Cap::default();
    let words = value.split(',').map(|w| w.trim().to_ascii_lowercase());
    let mut any = false;
    for word in words.filter(|w| !w.is_empty()) {
        let level = match word.as_str() {
            "scalar" => Level::Scalar,
            "avx2" => Level::Avx2,
            "avx512" => Level::Avx512,
            "novnni" => {
                cap.no_vnni = true;
                any = true;
                continue;
            }
            _ => return None,
        };
        cap.level = Some(cap.level.map_or(level, |l| l.min(level)));
        any = true;
    }
    any.then_some(cap)
}

impl Features {
    /// These features under `cap`: the level capped ([`Features::capped`]), and without the
    /// VNNI flags when it says so.
    pub fn under(self, cap: Cap) -> Features {
        let f = self.capped(cap.level);
        if cap.no_vnni { f.without_vnni() } else { f }
    }
}

/// The table: what the CPU has, the cap the environment set, and what the kernels use.
struct Table {
    cap: Cap,
    features: Features,
}

#[inline]
fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        let cap = std::env::var("OXGEN_ISA").ok().and_then(|v| {
            let cap = parse_cap(&v);
            if cap.is_none() && !v.trim().is_empty() {
                eprintln!(
                    "oxgen: ignoring OXGEN_ISA={v:?} (expected scalar, avx2 or avx512 and/or \
                     novnni, joined by commas); using every feature the CPU has"
                );
            }
            cap
        });
        let cap = cap.unwrap_or_default();
        Table {
            cap,
            features: Features::detect().under(cap),
        }
    })
}

/// What the kernels may use here: the detected features under the environment's cap (see
/// the module doc). Detected once; later calls are one load.
#[inline]
pub fn features() -> &'static Features {
    &table().features
}

/// The vector level the kernels may use here: `features().level`.
#[inline]
pub fn level() -> Level {
    features().level
}

/// The level cap the environment set (`OXGEN_ISA`), if any.
pub fn cap() -> Option<Level> {
    table().cap.level
}

/// Whether the environment cleared the VNNI flags (`OXGEN_ISA=...,novnni`).
pub fn no_vnni() -> bool {
    table().cap.no_vnni
}

/// A CPU with every feature the table knows, for tests of capping and choosing.
#[cfg(test)]
pub(crate) const EVERYTHING: Features = Features {
    level: Level::Avx512,
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
        let level = |l| {
            Some(Cap {
                level: Some(l),
                no_vnni: false,
            })
        };
        assert_eq!(parse_cap("scalar"), level(Level::Scalar));
        assert_eq!(parse_cap("AVX2"), level(Level::Avx2));
        assert_eq!(parse_cap(" avx512\n"), level(Level::Avx512));
        let no_vnni = |level| {
            Some(Cap {
                level,
                no_vnni: true,
            })
        };
        assert_eq!(parse_cap("novnni"), no_vnni(None));
        assert_eq!(parse_cap("avx512, NoVNNI"), no_vnni(Some(Level::Avx512)));
        assert_eq!(parse_cap("avx512,avx2"), level(Level::Avx2));
        for bad in ["", ",", "sse", "avx", "avx-512", "neon", "1", "avx2,vnni"] {
            assert_eq!(parse_cap(bad), None, "{bad:?}");
        }
        let under = EVERYTHING.under(parse_cap("avx2,novnni").unwrap());
        assert_eq!(
            (under.level, under.avxvnni, under.avx512vnni),
            (Level::Avx2, false, false)
        );
    }

    #[test]
    fn a_cap_lowers_the_level_and_clears_the_flags_above_it() {
        assert_eq!(EVERYTHING.capped(None), EVERYTHING);
        assert_eq!(EVERYTHING.capped(Some(Level::Avx512)), EVERYTHING);
        let avx2 = EVERYTHING.capped(Some(Level::Avx2));
        assert_eq!(
            avx2,
            Features {
                level: Level::Avx2,
                avx512bw: false,
                avx512vnni: false,
                ..EVERYTHING
            }
        );
        assert!(avx2.avx2_fma());
        assert_eq!(EVERYTHING.capped(Some(Level::Scalar)), Features::SCALAR);
        assert!(!Features::SCALAR.avx2_fma());
    }

    #[test]
    fn a_cap_never_raises_the_level() {
        let avx2_only = EVERYTHING.capped(Some(Level::Avx2));
        assert_eq!(avx2_only.capped(Some(Level::Avx512)), avx2_only);
        assert_eq!(
            Features::SCALAR.capped(Some(Level::Avx512)),
            Features::SCALAR
        );
        // Flags the CPU reports without their level stay off.
        let odd = Features {
            level: Level::Scalar,
            ..EVERYTHING
        };
        assert_eq!(odd.capped(None), Features::SCALAR);
    }

    #[test]
    fn the_table_is_the_detection_under_the_cap() {
        let detected = Features::detect();
        let f = *features();
        assert!(f.level <= detected.level);
        assert!(cap().is_none_or(|c| f.level <= c));
        for (used, has) in [
            (f.fma, detected.fma),
            (f.f16c, detected.f16c),
            (f.avxvnni, detected.avxvnni),
            (f.avx512bw, detected.avx512bw),
            (f.avx512vnni, detected.avx512vnni),
        ] {
            assert!(!used || has, "a flag the CPU lacks: {f:?} vs {detected:?}");
        }
        assert_eq!(level(), f.level);
    }
}
