//! Models by name: a folder of packages (the cache's `models/`, or `--models DIR`) as
//! `oxgen serve --models` serves it, with its optional per-model settings file (`oxgen.json`);
//! `oxgen list` and `oxgen rm`; a `MODEL` argument resolved as a path or as a name.
//!
//! Settings precedence, from strongest: a request's own fields, then the model's entry in
//! `DIR/oxgen.json`, then the command's flags and `OXGEN_*` variables, then the package's
//! own defaults.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use oxgen::{EmbedOptions, Embedder, KvBudget, Model, ModelOptions};
use oxgen_server::{Catalog, KeepAlive, ModelSpec, Opened};
use serde::Deserialize;

/// The settings file a models folder may hold.
pub const SETTINGS_FILE: &str = "oxgen.json";

/// `DIR/oxgen.json`: `{"models": {"NAME": {...}}}`, each entry a [`ModelSettings`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsFile {
    #[serde(default)]
    models: BTreeMap<String, ModelSettings>,
}

/// One model's settings in `oxgen.json`; each overrides the flag of the same name for that
/// model.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// Other names clients may use for it.
    #[serde(default)]
    aliases: Vec<String>,
    /// `--keep-alive`: a duration ("5m"), seconds, 0, or -1.
    keep_alive: Option<serde_json::Value>,
    /// `--ctx-size`.
    ctx_size: Option<usize>,
    /// `--kv-dtype`: f32, f16, bf16, int8.
    kv_dtype: Option<String>,
    /// `--kv-memory`, MiB.
    kv_memory: Option<u64>,
    /// `--threads`.
    threads: Option<usize>,
    /// `--backend`: native, ort, auto.
    backend: Option<String>,
    /// `--speculative`: prompt-lookup, draft:PATH (relative to the models folder), self:N.
    speculative: Option<String>,
    /// `--spec-tokens`.
    spec_tokens: Option<usize>,
    /// `--chat-template-kwargs`: a request's own take precedence, name by name.
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// `--max-tokens` of an encoder.
    max_tokens: Option<usize>,
    /// `--lora`: LoRA adapters by name, each a PEFT folder or an `.onnx_adapter` file
    /// (relative to the models folder); requests name them in `model`.
    #[serde(default)]
    lora: BTreeMap<String, PathBuf>,
    /// `--max-loras`.
    max_loras: Option<usize>,
}

impl SettingsFile {
    fn read(dir: &Path) -> anyhow::Result<SettingsFile> {
        let path = dir.join(SETTINGS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: not a valid settings file ({{\"models\": {{\"NAME\": {{\"ctx_size\": 4096, \
                 \"kv_dtype\": \"int8\", \"keep_alive\": \"10m\", ...}}}}}}; see the README's \
                 \"Several models\")",
                path.display()
            )
        })
    }
}

impl ModelSettings {
    /// `options` with this model's settings applied over them; `dir` is the models folder
    /// (a draft's relative path is read from there).
    pub fn apply(&self, options: &mut ModelOptions, dir: &Path) -> anyhow::Result<()> {
        if let Some(ctx) = self.ctx_size {
            options.memory.ctx_size = Some(ctx);
        }
        if let Some(dtype) = &self.kv_dtype {
            options.memory.kv_dtype = Some(dtype.parse().map_err(anyhow::Error::msg)?);
        }
        if let Some(mib) = self.kv_memory {
            options.memory.kv = KvBudget::Bytes((mib as usize).saturating_mul(1 << 20));
        }
        if let Some(threads) = self.threads {
            options.threads =
                crate::options::threads(&threads.to_string()).map_err(anyhow::Error::msg)?;
        }
        if let Some(backend) = &self.backend {
            options.backend = backend_named(backend)?;
        }
        if let Some(spec) = &self.speculative {
            let spec = match spec.strip_prefix("draft:") {
                Some(path) if Path::new(path).is_relative() => {
                    format!("draft:{}", dir.join(path).display())
                }
                _ => spec.clone(),
            };
            options.speculative = Some(spec.parse().map_err(anyhow::Error::msg)?);
        }
        if let Some(n) = self.spec_tokens {
            options.spec_tokens = n.clamp(1, oxgen::MAX_SPEC_TOKENS);
        }
        if let Some(kwargs) = &self.chat_template_kwargs {
            options.chat_template_kwargs.extend(kwargs.clone());
        }
        if !self.lora.is_empty() {
            options.lora = (self.lora.iter())
                .map(|(name, path)| (name.clone(), dir.join(path)))
                .collect();
        }
        if let Some(n) = self.max_loras {
            options.max_loras = n;
        }
        Ok(())
    }

    fn apply_encoder(&self, options: &mut EmbedOptions) -> anyhow::Result<()> {
        if let Some(threads) = self.threads {
            options.threads = threads;
        }
        if let Some(backend) = &self.backend {
            options.backend = backend_named(backend)?;
        }
        if self.max_tokens.is_some() {
            options.max_tokens = self.max_tokens;
        }
        Ok(())
    }
}

fn backend_named(name: &str) -> anyhow::Result<oxgen::Backend> {
    oxgen::Backend::parse(name)
        .ok_or_else(|| anyhow::anyhow!("backend '{name}' is not native, ort or auto"))
}

/// Opens the language model at `path` as `oxgen serve` does, saying why when `auto` picked
/// ONNX Runtime.
pub fn open_lm(path: &Path, options: &ModelOptions) -> Result<Model, String> {
    let model = Model::open(path, options).map_err(|e| e.to_string())?;
    if let Some(note) = model.backend_note() {
        eprintln!("note: {note}");
    }
    Ok(model)
}

/// Opens the encoder package at `path` as `oxgen serve` does, saying why when `auto` picked
/// ONNX Runtime.
pub fn open_encoder(path: &Path, options: &EmbedOptions) -> Result<Embedder, String> {
    let embedder = Embedder::open(path, options).map_err(|e| e.to_string())?;
    if let Some(note) = embedder.backend_note() {
        eprintln!("note: {note}");
    }
    Ok(embedder)
}

/// Whether `dir` holds a package oxgen loads: a language model (onnxruntime-genai's or
/// optimum's layout) or an encoder.
pub fn is_package(dir: &Path) -> bool {
    dir.join("genai_config.json").is_file()
        || (dir.join("config.json").is_file() && dir.join("model.onnx").is_file())
        || oxgen::embed::is_encoder_package(dir)
}

/// Bytes of the files in a package folder (its weights, mostly).
pub fn package_bytes(dir: &Path) -> u64 {
    let Ok(read) = std::fs::read_dir(dir) else {
        return 0;
    };
    read.flatten()
        .filter_map(|f| f.metadata().ok().filter(|m| m.is_file()))
        .map(|m| m.len())
        .sum()
}

/// The packages directly under `dir`, by folder name.
pub fn packages(dir: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let read = std::fs::read_dir(dir)
        .with_context(|| format!("reading the models folder {}", dir.display()))?;
    let mut found: Vec<(String, PathBuf)> = read
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && is_package(p))
        .filter_map(|p| Some((p.file_name()?.to_str()?.to_string(), p)))
        .collect();
    found.sort();
    Ok(found)
}

/// A folder of packages as `oxgen serve --models` serves it: read again whenever a request
/// names a model not yet known, so packages added later are served and removed ones are not.
pub struct Folder {
    pub dir: PathBuf,
    /// From the flags; each model's settings apply over them.
    pub options: ModelOptions,
    pub encoder: EmbedOptions,
    pub keep_alive: KeepAlive,
}

impl Folder {
    /// The package at `path`, served as `name` with `settings` over the flags' options.
    pub fn spec(
        &self,
        name: String,
        path: PathBuf,
        settings: &ModelSettings,
    ) -> anyhow::Result<ModelSpec> {
        let keep_alive = match &settings.keep_alive {
            Some(v) => KeepAlive::from_json(v).map_err(anyhow::Error::msg)?,
            None => self.keep_alive,
        };
        let bytes = package_bytes(&path);
        let dir = Some(path.clone());
        // A language model's context as it will load: the package's, cut by ctx_size.
        let ctx_size = settings.ctx_size.or(self.options.memory.ctx_size);
        let context = oxgen::PackageConfig::read(&path)
            .ok()
            .map(|c| ctx_size.map_or(c.context_length, |n| n.min(c.context_length)))
            .filter(|_| !oxgen::embed::is_encoder_package(&path));
        let mut lora = Vec::new();
        let load: oxgen_server::Load = match oxgen::embed::is_encoder_package(&path) {
            true => {
                let mut options = self.encoder.clone();
                settings.apply_encoder(&mut options)?;
                Arc::new(move || open_encoder(&path, &options).map(Opened::Encoder))
            }
            false => {
                let mut options = self.options.clone();
                settings.apply(&mut options, &self.dir)?;
                lora = options.lora.clone();
                Arc::new(move || open_lm(&path, &options).map(Opened::Lm))
            }
        };
        Ok(ModelSpec {
            name,
            aliases: settings.aliases.clone(),
            dir,
            bytes,
            context,
            keep_alive,
            lora,
            load,
        })
    }
}

impl Catalog for Folder {
    fn scan(&self) -> Result<Vec<ModelSpec>, String> {
        let run = || -> anyhow::Result<Vec<ModelSpec>> {
            let settings = SettingsFile::read(&self.dir)?;
            for name in settings.models.keys() {
                if !self.dir.join(name).is_dir() {
                    eprintln!(
                        "oxgen serve: {SETTINGS_FILE} has settings for '{name}', which is not a \
                         package folder in {}",
                        self.dir.display()
                    );
                }
            }
            let none = ModelSettings::default();
            (packages(&self.dir)?.into_iter())
                .map(|(name, path)| {
                    let s = settings.models.get(&name).unwrap_or(&none);
                    self.spec(name.clone(), path, s)
                        .with_context(|| format!("{SETTINGS_FILE}, model '{name}'"))
                })
                .collect()
        };
        run().map_err(|e| format!("{e:#}"))
    }
}

/// A `MODEL` argument: a package folder's path, or a package's name in the cache's
/// `models/` folder, then in `$OXGEN_MODELS`.
pub fn resolve(model: &str) -> anyhow::Result<PathBuf> {
    let path = PathBuf::from(model);
    let plain_name = !model.contains(std::path::MAIN_SEPARATOR) && !model.starts_with('.');
    if path.exists() || !plain_name {
        return Ok(path);
    }
    let mut looked = Vec::new();
    for folder in model_folders() {
        let candidate = folder.join(model);
        if is_package(&candidate) {
            return Ok(candidate);
        }
        looked.push(folder.display().to_string());
    }
    bail!(
        "'{model}' is neither a package folder nor a model in {} (oxgen list shows them; oxgen \
         pull or oxgen import adds one)",
        looked.join(" or ")
    )
}

/// Where names are looked up: the cache's `models/`, then `$OXGEN_MODELS`.
fn model_folders() -> Vec<PathBuf> {
    let mut folders: Vec<PathBuf> = crate::pull::cache_dir()
        .map(|c| c.join("models"))
        .into_iter()
        .collect();
    if let Some(dir) = std::env::var_os("OXGEN_MODELS") {
        folders.push(PathBuf::from(dir));
    }
    folders
}

/// `oxgen list`.
#[derive(clap::Args)]
pub struct ListArgs {
    /// A models folder to list instead of the cache's `models/` (and `$OXGEN_MODELS`).
    #[arg(long, env = "OXGEN_MODELS")]
    models: Option<PathBuf>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// What `oxgen list` says of a package.
#[derive(serde::Serialize)]
struct Listed {
    name: String,
    path: String,
    kind: &'static str,
    family: String,
    quantization: String,
    context: Option<usize>,
    bytes: u64,
}

pub fn list(args: &ListArgs) -> anyhow::Result<()> {
    let folders = match &args.models {
        Some(dir) => vec![dir.clone()],
        None => model_folders(),
    };
    let mut rows = Vec::new();
    for folder in folders.iter().filter(|f| f.is_dir()) {
        for (name, path) in packages(folder)? {
            rows.push(describe(name, &path));
        }
    }
    if args.json {
        for row in &rows {
            println!("{}", serde_json::to_string(row)?);
        }
        return Ok(());
    }
    if rows.is_empty() {
        eprintln!(
            "no models in {} (oxgen pull fetches the default one, oxgen import converts a GGUF or \
             a Hugging Face folder)",
            folders
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        );
        return Ok(());
    }
    println!(
        "{:<32} {:<9} {:<12} {:<14} {:>8} {:>10}  PATH",
        "NAME", "KIND", "FAMILY", "QUANTIZATION", "CONTEXT", "SIZE"
    );
    for r in rows {
        println!(
            "{:<32} {:<9} {:<12} {:<14} {:>8} {:>10}  {}",
            r.name,
            r.kind,
            r.family,
            r.quantization,
            r.context.map_or("-".into(), |c| c.to_string()),
            crate::inspect::human(r.bytes),
            r.path
        );
    }
    Ok(())
}

/// A package's kind, family, quantization and context, from its configs and graph.
fn describe(name: String, path: &Path) -> Listed {
    let encoder = oxgen::embed::is_encoder_package(path);
    let json = |file: &str| -> Option<serde_json::Value> {
        serde_json::from_str(&std::fs::read_to_string(path.join(file)).ok()?).ok()
    };
    let (genai, config) = (json("genai_config.json"), json("config.json"));
    let family = (genai.as_ref())
        .and_then(|g| g.pointer("/model/type"))
        .or_else(|| config.as_ref()?.get("model_type"))
        .and_then(|v| v.as_str())
        .unwrap_or("-")
        .to_string();
    let context = match encoder {
        true => None,
        false => oxgen::PackageConfig::read(path)
            .ok()
            .map(|c| c.context_length),
    };
    let graph = match encoder {
        true => oxgen::embed::encoder_graph(path),
        false => oxgen::PackageConfig::read(path)
            .ok()
            .map(|c| path.join(c.model_file)),
    };
    Listed {
        kind: if encoder { "encoder" } else { "generate" },
        quantization: graph.map_or("-".into(), |g| quantization(&g)),
        path: path.display().to_string(),
        bytes: package_bytes(path),
        name,
        family,
        context,
    }
}

/// How a graph's weights are stored: `q4` (`MatMulNBits` with its bits and block size),
/// `int8` (dynamic quantization), `mxfp4` experts, else the dtype most weight bytes have.
fn quantization(graph: &Path) -> String {
    let Ok(model) = oxgen_onnx::Model::load(graph) else {
        return "-".into();
    };
    let g = model.graph();
    let attr = |node: &oxgen_onnx::proto::NodeProto, name: &str| {
        (node.attribute.iter())
            .find(|a| a.name() == name)
            .map(|a| a.i())
    };
    let mut kinds = std::collections::BTreeSet::new();
    for node in &g.node {
        match node.op_type() {
            "MatMulNBits" => {
                let bits = attr(node, "bits").unwrap_or(4);
                let block = attr(node, "block_size").unwrap_or(0);
                kinds.insert(format!("q{bits}/{block}"));
            }
            "MatMulInteger" | "MatMulIntegerToFloat" | "DynamicQuantizeLinear" => {
                kinds.insert("int8".into());
            }
            "QMoE" => {
                kinds.insert("qmoe".into());
            }
            _ => {}
        }
    }
    if !kinds.is_empty() {
        return kinds.into_iter().collect::<Vec<_>>().join("+");
    }
    let mut by_dtype: BTreeMap<String, u64> = BTreeMap::new();
    for t in &g.initializer {
        let dtype = oxgen_tensor::DType::from_onnx(t.data_type())
            .map_or("?".to_string(), |d| format!("{d:?}").to_lowercase());
        *by_dtype.entry(dtype).or_default() += crate::inspect::tensor_bytes(t);
    }
    (by_dtype.into_iter())
        .max_by_key(|(_, bytes)| *bytes)
        .map_or("-".into(), |(d, _)| d)
}

/// `oxgen rm`.
#[derive(clap::Args)]
pub struct RmArgs {
    /// The model's name (its folder in the cache's `models/`, or in --models).
    name: String,
    /// The models folder to remove it from instead of the cache's `models/`.
    #[arg(long, env = "OXGEN_MODELS")]
    models: Option<PathBuf>,
}

pub fn rm(args: &RmArgs) -> anyhow::Result<()> {
    if args.name.is_empty() || args.name.contains(['/', '\\']) || args.name.starts_with('.') {
        bail!(
            "'{}' is not a model name; give a name as oxgen list shows it",
            args.name
        );
    }
    let folders = match &args.models {
        Some(dir) => vec![dir.clone()],
        None => model_folders(),
    };
    let Some(path) = (folders.iter())
        .map(|f| f.join(&args.name))
        .find(|p| is_package(p))
    else {
        bail!(
            "no model '{}' in {} (oxgen list shows them)",
            args.name,
            folders
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        );
    };
    let bytes = package_bytes(&path);
    std::fs::remove_dir_all(&path).with_context(|| format!("removing {}", path.display()))?;
    println!(
        "deleted '{}' ({}, {})",
        args.name,
        crate::inspect::human(bytes),
        path.display()
    );
    Ok(())
}
