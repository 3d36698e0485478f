//! The LoRA adapters a server serves, each named like a model: a request whose `model` names
//! an adapter runs on the adapter's base model (its `parent` in `/v1/models`) under it.
//!
//! The registry outlives the base model's loads: adapters given with `--lora` are loaded
//! with the model, ones loaded through `/v1/load_lora_adapter` are loaded on the model's
//! engine thread between steps and again whenever the model is loaded anew (after it was
//! unloaded for room or idleness). Requests in flight per adapter are counted for the
//! gateway's LoRA metric (`oxgen_lora_requests_info`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

/// An adapter served.
#[derive(Debug, Clone)]
pub(crate) struct Lora {
    /// The model it adapts.
    pub base: String,
    pub path: PathBuf,
    /// What the base model reported when it loaded it (`None` until then).
    pub info: Option<oxgen::AdapterInfo>,
}

/// Every adapter served, and the requests in flight under each.
#[derive(Default)]
pub(crate) struct Adapters {
    by_name: Mutex<BTreeMap<String, Lora>>,
    /// Adapters unloaded through the API: not served again (a model that lists them in its
    /// settings loads without them) until loaded again.
    removed: Mutex<BTreeSet<String>>,
    in_flight: Arc<Mutex<BTreeMap<String, usize>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Adapters {
    pub fn insert(&self, name: &str, lora: Lora) {
        lock(&self.removed).remove(name);
        lock(&self.by_name).insert(name.to_string(), lora);
    }

    /// Stops serving `name` (see `removed`).
    pub fn remove(&self, name: &str) {
        lock(&self.removed).insert(name.to_string());
        lock(&self.by_name).remove(name);
    }

    /// Whether `name` was unloaded through the API.
    pub fn is_removed(&self, name: &str) -> bool {
        lock(&self.removed).contains(name)
    }

    /// Every adapter, by name.
    pub fn list(&self) -> Vec<(String, Lora)> {
        (lock(&self.by_name).iter())
            .map(|(n, l)| (n.clone(), l.clone()))
            .collect()
    }

    /// The adapters of model `base`, by name.
    pub fn of_model(&self, base: &str) -> Vec<(String, Lora)> {
        self.list()
            .into_iter()
            .filter(|(_, l)| l.base == base)
            .collect()
    }

    /// Counts a request under adapter `name` until the guard drops.
    pub fn begin(&self, name: &str) -> InFlight {
        *lock(&self.in_flight).entry(name.to_string()).or_default() += 1;
        InFlight {
            name: name.to_string(),
            counts: self.in_flight.clone(),
        }
    }

    /// Adapters with requests in flight, by name.
    pub fn busy(&self) -> Vec<String> {
        (lock(&self.in_flight).iter())
            .filter(|(_, n)| **n > 0)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// A request in flight under an adapter ([`Adapters::begin`]).
pub(crate) struct InFlight {
    pub name: String,
    counts: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl Clone for InFlight {
    /// Another hold on the same count (the job's, beside the request's lease).
    fn clone(&self) -> InFlight {
        *lock(&self.counts).entry(self.name.clone()).or_default() += 1;
        InFlight {
            name: self.name.clone(),
            counts: self.counts.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut counts = lock(&self.counts);
        if let Some(n) = counts.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.name);
            }
        }
    }
}
