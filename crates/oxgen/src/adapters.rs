//! LoRA adapters by name over one model: read from their files (`oxgen-import`), held by the
//! backend beside the base weights, chosen per generation ([`crate::GenerateOptions::adapter`]),
//! at most [`ModelOptions::max_loras`] at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use oxgen_runtime::Adapter;
use oxgen_runtime::{AdapterId, LanguageModel};

use crate::{Error, ModelOptions};

/// What a loaded adapter is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterInfo {
    pub name: String,
    pub path: PathBuf,
    /// The largest rank of its products.
    pub rank: usize,
    /// Projections it adapts.
    pub modules: usize,
    /// Bytes its matrices hold in memory (f32).
    pub bytes: usize,
}

/// Reads the adapter at `path` (a PEFT folder or an `.onnx_adapter` file) to be loaded as
/// `name` ([`crate::Model::add_adapter`]): the slow part of loading one, which a server does
/// away from the model's thread.
pub fn read_adapter(name: &str, path: &Path) -> Result<Adapter, Error> {
    oxgen_import::read_adapter(path).map_err(|e| Error::Adapter {
        name: name.to_string(),
        reason: e.to_string(),
    })
}

/// The most adapters a model opened with `options` holds at once (0: it runs none, and its
/// gate and up projections may be fused).
pub fn max_adapters(options: &ModelOptions) -> usize {
    options.max_loras.max(options.lora.len())
}

/// A model's adapters by name.
pub(crate) struct Adapters {
    by_name: BTreeMap<String, (AdapterId, AdapterInfo)>,
    max: usize,
}

impl Adapters {
    pub(crate) fn new(max: usize) -> Adapters {
        Adapters {
            by_name: BTreeMap::new(),
            max,
        }
    }

    /// Reads the adapter at `path` and has `lm` hold it as `name`.
    pub(crate) fn load(
        &mut self,
        lm: &mut dyn LanguageModel,
        name: &str,
        path: &Path,
    ) -> Result<AdapterInfo, Error> {
        self.check(name)?;
        self.add(lm, name, path, read_adapter(name, path)?)
    }

    /// Whether an adapter may be added as `name` now.
    fn check(&self, name: &str) -> Result<(), Error> {
        let refuse = |reason: String| Error::Adapter {
            name: name.to_string(),
            reason,
        };
        if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
            return Err(refuse(
                "an adapter's name must be 1 to 256 characters, none of them control characters"
                    .into(),
            ));
        }
        if self.by_name.contains_key(name) {
            return Err(refuse(
                "an adapter of this name is loaded already; unload it first".into(),
            ));
        }
        if self.by_name.len() >= self.max {
            return Err(refuse(match self.max {
                0 => "this model was opened without room for LoRA adapters; open it with \
                      --lora NAME=PATH or --max-loras N"
                    .into(),
                max => format!(
                    "{max} adapters are loaded, the most this model holds (--max-loras); \
                     unload one first"
                ),
            }));
        }
        Ok(())
    }

    /// Has `lm` hold `adapter` (read from `path`) as `name`.
    pub(crate) fn add(
        &mut self,
        lm: &mut dyn LanguageModel,
        name: &str,
        path: &Path,
        adapter: Adapter,
    ) -> Result<AdapterInfo, Error> {
        self.check(name)?;
        let refuse = |reason: String| Error::Adapter {
            name: name.to_string(),
            reason,
        };
        let info = AdapterInfo {
            name: name.to_string(),
            path: path.to_path_buf(),
            rank: adapter.rank(),
            modules: adapter.modules.len(),
            bytes: adapter.nbytes(),
        };
        let id = lm
            .load_adapter(adapter)
            .map_err(|e| refuse(e.to_string()))?;
        self.by_name.insert(name.to_string(), (id, info.clone()));
        Ok(info)
    }

    /// Drops adapter `name` (generations running under it finish under it).
    pub(crate) fn unload(&mut self, lm: &mut dyn LanguageModel, name: &str) -> Result<(), Error> {
        let (id, _) = self
            .by_name
            .remove(name)
            .ok_or_else(|| self.unknown(name))?;
        lm.unload_adapter(id);
        Ok(())
    }

    /// The id of adapter `name` (`None`: the base model).
    pub(crate) fn id(&self, name: Option<&str>) -> Result<Option<AdapterId>, Error> {
        name.map(|n| {
            (self.by_name.get(n))
                .map(|(id, _)| *id)
                .ok_or_else(|| self.unknown(n))
        })
        .transpose()
    }

    /// The most it holds at once.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    pub(crate) fn list(&self) -> Vec<AdapterInfo> {
        self.by_name
            .values()
            .map(|(_, info)| info.clone())
            .collect()
    }

    fn unknown(&self, name: &str) -> Error {
        Error::UnknownAdapter {
            name: name.to_string(),
            loaded: self.by_name.keys().cloned().collect(),
        }
    }
}
