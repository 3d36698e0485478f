//! External data: parsing a tensor's `external_data` entries and checking its location.
//!
//! ONNX stores large tensors outside the model file: `data_location = EXTERNAL` and
//! `external_data` key/values `location` (required, a path relative to the model's folder),
//! `offset` and `length` (optional decimal integers); see `TensorProto.external_data` in
//! `onnx.proto` and `onnx/external_data_helper.py`. `checksum` and unknown keys are ignored.
//!
//! Model files are untrusted (DESIGN.md §5.3), so a location must be a plain relative path:
//! not absolute, no `..`, and after resolving symbolic links still inside the model's folder.
//! Offsets and lengths are parsed as `u64` and checked for overflow and against the file size
//! before any byte is touched (see `Model::tensor`).

use std::path::{Component, Path, PathBuf};

use crate::OnnxError;
use crate::proto::TensorProto;
use crate::tensor::name_of;

/// One tensor's reference into an external data file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExternalRef {
    pub location: String,
    pub offset: u64,
    pub length: Option<u64>,
}

/// Reads `location`, `offset` and `length` from `t.external_data`; `file` is the model file.
pub(crate) fn parse_ref(t: &TensorProto, file: &Path) -> Result<ExternalRef, OnnxError> {
    let key_err = |key: &'static str, value: &str, problem: &str| OnnxError::ExternalKey {
        file: file.to_path_buf(),
        tensor: name_of(t),
        key,
        value: value.to_string(),
        problem: problem.to_string(),
    };
    let mut location = None;
    let mut offset = 0;
    let mut length = None;
    for entry in &t.external_data {
        let value = entry.value.as_deref().unwrap_or("");
        let parse = |key| {
            value.trim().parse::<u64>().map_err(|_| {
                key_err(
                    key,
                    value,
                    "must be a non-negative decimal integer that fits in 64 bits",
                )
            })
        };
        match entry.key.as_deref().unwrap_or("") {
            "location" => location = Some(value.to_string()),
            "offset" => offset = parse("offset")?,
            "length" => length = Some(parse("length")?),
            _ => {}
        }
    }
    let location = match location {
        Some(l) if !l.is_empty() => l,
        other => {
            return Err(key_err(
                "location",
                other.as_deref().unwrap_or(""),
                "missing or empty: an external tensor must name its data file",
            ));
        }
    };
    Ok(ExternalRef {
        location,
        offset,
        length,
    })
}

/// Checks that `location` is a plain relative path (no root, no prefix, no `..`) and joins it
/// to `base_dir`. Symbolic links are checked by [`resolve_inside`].
pub(crate) fn join_location(
    base_dir: &Path,
    location: &str,
    t: &TensorProto,
    file: &Path,
) -> Result<PathBuf, OnnxError> {
    let path_err = |problem: &str| OnnxError::ExternalPath {
        file: file.to_path_buf(),
        tensor: name_of(t),
        location: location.to_string(),
        problem: problem.to_string(),
    };
    if location.contains('\0') {
        return Err(path_err("contains a NUL byte"));
    }
    for component in Path::new(location).components() {
        match component {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return Err(path_err("contains '..'")),
            Component::RootDir | Component::Prefix(_) => return Err(path_err("is absolute")),
        }
    }
    Ok(base_dir.join(location))
}

/// Resolves `joined` (from [`join_location`]) through symbolic links and checks that it is a
/// regular file inside `base_dir`. Returns the canonical path.
pub(crate) fn resolve_inside(
    base_dir: &Path,
    joined: &Path,
    location: &str,
    t: &TensorProto,
    file: &Path,
) -> Result<PathBuf, OnnxError> {
    let base = base_dir
        .canonicalize()
        .map_err(|e| OnnxError::io(base_dir, "resolve the model folder", e))?;
    let target = joined.canonicalize().map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            OnnxError::MissingDataFile {
                file: joined.to_path_buf(),
                tensor: name_of(t),
                source,
            }
        } else {
            OnnxError::io(joined, "resolve", source)
        }
    })?;
    let path_err = |problem: String| OnnxError::ExternalPath {
        file: file.to_path_buf(),
        tensor: name_of(t),
        location: location.to_string(),
        problem,
    };
    if !target.starts_with(&base) {
        return Err(path_err(format!(
            "resolves to {}, outside the model folder {}",
            target.display(),
            base.display()
        )));
    }
    let meta =
        std::fs::metadata(&target).map_err(|e| OnnxError::io(&target, "read metadata of", e))?;
    if !meta.is_file() {
        return Err(path_err(format!(
            "resolves to {}, which is not a regular file",
            target.display()
        )));
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::StringStringEntryProto;

    fn with_entries(entries: &[(&str, &str)]) -> TensorProto {
        TensorProto {
            name: Some("w".into()),
            external_data: entries
                .iter()
                .map(|(k, v)| StringStringEntryProto {
                    key: Some(k.to_string()),
                    value: Some(v.to_string()),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn parses_location_offset_length() {
        let t = with_entries(&[
            ("location", "a.data"),
            ("offset", "4096"),
            ("length", "12"),
            ("checksum", "x"),
        ]);
        let r = parse_ref(&t, Path::new("m.onnx")).unwrap();
        assert_eq!(
            r,
            ExternalRef {
                location: "a.data".into(),
                offset: 4096,
                length: Some(12)
            }
        );
        let r = parse_ref(
            &with_entries(&[("location", "a.data")]),
            Path::new("m.onnx"),
        )
        .unwrap();
        assert_eq!((r.offset, r.length), (0, None));
    }

    #[test]
    fn rejects_bad_keys() {
        for (entries, key) in [
            (&[("offset", "1")][..], "location"),
            (&[("location", "")][..], "location"),
            (&[("location", "a"), ("offset", "-1")][..], "offset"),
            (
                &[("location", "a"), ("length", "99999999999999999999999")][..],
                "length",
            ),
        ] {
            let e = parse_ref(&with_entries(entries), Path::new("m.onnx")).unwrap_err();
            assert!(
                matches!(&e, OnnxError::ExternalKey { key: k, .. } if *k == key),
                "{e}"
            );
            assert!(
                e.to_string().contains("m.onnx") && e.to_string().contains("'w'"),
                "{e}"
            );
        }
    }

    #[test]
    fn rejects_escaping_locations() {
        let t = with_entries(&[]);
        for loc in ["../x.data", "a/../../x", "/etc/passwd", "a\0b"] {
            let e = join_location(Path::new("/m"), loc, &t, Path::new("m.onnx")).unwrap_err();
            assert!(matches!(e, OnnxError::ExternalPath { .. }), "{loc}: {e}");
        }
        assert_eq!(
            join_location(Path::new("/m"), "./d/x.data", &t, Path::new("m.onnx")).unwrap(),
            Path::new("/m/./d/x.data")
        );
    }
}
