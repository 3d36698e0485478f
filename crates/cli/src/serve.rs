//! `oxgen serve [MODEL]`: the OpenAI-compatible HTTP server.

use std::time::Duration;

use anyhow::{Context, bail};
use oxgen::{KvBudget, ModelOptions, ToolFormat};
use oxgen_server::{
    CloseObjects, Config, DEFAULT_BODY_TIMEOUT_SECS, DEFAULT_HEADER_TIMEOUT_SECS,
    DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY, DEFAULT_MAX_QUEUE, DEFAULT_MAX_TOKENS_LIMIT,
    DEFAULT_PREFILL_CHUNK, DEFAULT_REQUEST_TIMEOUT_SECS, DEFAULT_SHUTDOWN_TIMEOUT_SECS, KeepAlive,
    Server,
};

use crate::embed::EncoderArgs;
use crate::models::{self, Folder};
use crate::options::{BackendArgs, RunArgs, model_dir};

#[derive(clap::Args)]
pub struct Args {
    /// Package folders or model names (oxgen list); without any (and without --models) the
    /// default model is used, pulled first if needed. One is loaded at start and kept; with
    /// several (or --models) each loads when a request first names it.
    model: Vec<String>,
    /// Serve every package in this folder, each under its folder's name, loaded when a
    /// request names it (settings per model in DIR/oxgen.json).
    #[arg(long, env = "OXGEN_MODELS", value_name = "DIR")]
    models: Option<std::path::PathBuf>,
    /// MiB the models in memory may hold together (weights and KV caches); the least
    /// recently used idle model is unloaded to make room. Default with several models: 3/4
    /// of the memory the process may use (its cgroup's limit, else the machine's).
    #[arg(long, env = "OXGEN_MEMORY_BUDGET", value_name = "MIB",
          value_parser = clap::value_parser!(u64).range(1..))]
    memory_budget: Option<u64>,
    /// How long a model stays in memory after its last request, with several models: a
    /// duration (30s, 5m, 1h), 0 (unload when idle) or -1 (until the budget needs the room).
    /// A request's keep_alive overrides it for that model.
    #[arg(long, env = "OXGEN_KEEP_ALIVE", default_value = "5m", value_parser = keep_alive,
          allow_hyphen_values = true)]
    keep_alive: KeepAlive,
    /// Do not serve the admin endpoints (/admin/models: list, load, unload).
    #[arg(long, env = "OXGEN_NO_ADMIN")]
    no_admin: bool,
    /// Address to listen on.
    #[arg(long, env = "OXGEN_HOST", default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one; the address is printed).
    #[arg(long, env = "OXGEN_PORT", default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long, env = "OXGEN_API_KEY", conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Read the API key from this file (its first line).
    #[arg(long, env = "OXGEN_API_KEY_FILE")]
    api_key_file: Option<std::path::PathBuf>,
    /// The model id clients send in `model` (default: the package folder's name).
    #[arg(long, env = "OXGEN_MODEL_ID")]
    model_id: Option<String>,
    /// Another name accepted in `model` (repeatable; comma-separated in the variable).
    #[arg(long, env = "OXGEN_ALIAS", value_delimiter = ',')]
    alias: Vec<String>,
    /// Requests that may wait for a slot (at least 1); more get 429 with Retry-After.
    #[arg(long, env = "OXGEN_MAX_QUEUE", default_value_t = DEFAULT_MAX_QUEUE as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_queue: u64,
    /// Sequences generating at once (a request with n choices counts n); also bounds n.
    #[arg(long, env = "OXGEN_MAX_BATCH", default_value_t = DEFAULT_MAX_BATCH as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_batch: u64,
    /// Prompt tokens a sequence prefills per step; longer prompts go a chunk per step while
    /// the running streams keep decoding.
    #[arg(long, env = "OXGEN_PREFILL_CHUNK", default_value_t = DEFAULT_PREFILL_CHUNK as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    prefill_chunk: u64,
    /// KV cache blocks (16 positions each) shared by all requests; a request waits until
    /// the blocks for its prompt plus max_tokens are free (default: enough for --max-batch
    /// sequences of the whole context).
    #[arg(long, env = "OXGEN_KV_BLOCKS", conflicts_with = "kv_memory",
          value_parser = clap::value_parser!(u64).range(1..))]
    kv_blocks: Option<u64>,
    /// KV cache budget in MiB, instead of --kv-blocks.
    #[arg(long, env = "OXGEN_KV_MEMORY", value_parser = clap::value_parser!(u64).range(1..))]
    kv_memory: Option<u64>,
    /// Do not keep prompt blocks for later requests with the same prefix.
    #[arg(long, env = "OXGEN_NO_PREFIX_CACHE", conflicts_with = "kv_disk_cache")]
    no_prefix_cache: bool,
    /// The most tokens a request may ask for, and what it gets when it asks for none (always
    /// capped by the context left after the prompt).
    #[arg(long, env = "OXGEN_MAX_TOKENS_LIMIT", default_value_t = DEFAULT_MAX_TOKENS_LIMIT as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_tokens_limit: u64,
    /// Seconds a request may take from arrival to its last token (0: no limit).
    #[arg(long, env = "OXGEN_REQUEST_TIMEOUT", default_value_t = DEFAULT_REQUEST_TIMEOUT_SECS)]
    request_timeout: u64,
    /// Seconds a request body may take to arrive; slower ones get 408.
    #[arg(long, env = "OXGEN_BODY_TIMEOUT", default_value_t = DEFAULT_BODY_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout: u64,
    /// Seconds a connection may take to send a request's head (line and headers), counted from
    /// when it opened or its previous response ended; slower or idle ones are closed.
    #[arg(long, env = "OXGEN_HEADER_TIMEOUT", default_value_t = DEFAULT_HEADER_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout: u64,
    /// Largest request body in bytes; bigger ones get 413.
    #[arg(long, env = "OXGEN_MAX_BODY", default_value_t = DEFAULT_MAX_BODY)]
    max_body: usize,
    /// Seconds running requests get to finish after SIGTERM before they are failed.
    #[arg(long, env = "OXGEN_SHUTDOWN_TIMEOUT", default_value_t = DEFAULT_SHUTDOWN_TIMEOUT_SECS)]
    shutdown_timeout: u64,
    /// How tool calls are written and parsed: hermes, llama3, mistral, phi4-mini, nemotron,
    /// harmony, or json (oxgen describes the tools in the system message); default: what the
    /// chat template implies.
    #[arg(long, env = "OXGEN_TOOL_PARSER",
          value_parser = ["hermes", "llama3", "mistral", "phi4-mini", "nemotron", "harmony", "json"])]
    tool_parser: Option<String>,
    /// Answer a request field this server does not implement with a 400 naming it (by
    /// default such fields are ignored and named in the x-oxgen-ignored-fields header).
    #[arg(long, env = "OXGEN_STRICT_API")]
    strict_api: bool,
    /// An origin browsers may call the API from (repeatable; comma-separated in the
    /// variable; `*` for any): preflights are answered and responses carry CORS headers.
    /// The API key is still required where one is set. Default: none (no CORS).
    #[arg(long, env = "OXGEN_CORS_ORIGIN", value_delimiter = ',')]
    cors_origin: Vec<String>,
    /// Responses API objects kept in memory for `previous_response_id` and
    /// `GET /v1/responses/{id}`: the newest N (0: none are kept).
    #[arg(long, env = "OXGEN_RESPONSES_STORE", default_value_t = oxgen_server::DEFAULT_RESPONSES_STORE)]
    responses_store: usize,
    /// Do not serve the chat page at `/` (it is served by default, without the API key; the
    /// page asks for the key and sends it with its calls).
    #[arg(long, env = "OXGEN_NO_WEBUI")]
    no_webui: bool,
    /// Whose JSON schema objects are closed (`additionalProperties: false` where an object
    /// with properties says nothing of it): `strict` (schemas and tools with `strict: true`),
    /// `tools` (those and every tool's parameters; the default) or `all`. A request's
    /// `close_objects` field overrides it.
    #[arg(long, env = "OXGEN_CLOSE_OBJECTS", default_value = "tools",
          value_parser = ["strict", "tools", "all"])]
    close_objects: String,
    #[command(flatten)]
    backend: BackendArgs,
    #[command(flatten)]
    run: RunArgs,
    /// For an encoder package (embeddings and reranking).
    #[command(flatten)]
    encoder: EncoderArgs,
    /// Serve a decoder package as an embedding model (/v1/embeddings, /v1/rerank by
    /// cosine) from its final hidden states, last-token pooled unless --pooling says
    /// otherwise, instead of as a chat model.
    #[arg(long, env = "OXGEN_EMBEDDING")]
    embedding: bool,
}

fn keep_alive(s: &str) -> Result<KeepAlive, String> {
    KeepAlive::parse(s)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let dirs = (args.model.iter())
        .map(|m| models::resolve(m))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let single = args.models.is_none() && dirs.len() <= 1;
    let dir = match (single, dirs.first()) {
        (true, None) => model_dir(None)?,
        (_, Some(dir)) => dir.clone(),
        (false, None) => std::path::PathBuf::new(),
    };
    if single && !dir.exists() {
        bail!(
            "{}: no such package folder (oxgen pull fetches the default model, oxgen import converts a GGUF)",
            dir.display()
        );
    }
    let api_key = match (&args.api_key, &args.api_key_file) {
        (Some(key), _) => Some(key.clone()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the API key file {}", path.display()))?;
            let key = text.lines().next().unwrap_or_default().trim().to_string();
            if key.is_empty() {
                bail!("{}: the API key file is empty", path.display());
            }
            Some(key)
        }
        (None, None) => None,
    };
    let model_id = args.model_id.clone().unwrap_or_else(|| {
        dir.canonicalize()
            .unwrap_or_else(|_| dir.clone())
            .file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned())
    });
    let config = Config {
        model_id,
        aliases: args.alias.clone(),
        api_key,
        max_queue: args.max_queue as usize,
        max_batch: args.max_batch as usize,
        prefill_chunk: args.prefill_chunk as usize,
        max_tokens_limit: args.max_tokens_limit as usize,
        request_timeout: (args.request_timeout > 0)
            .then(|| Duration::from_secs(args.request_timeout)),
        max_body: args.max_body,
        body_timeout: Duration::from_secs(args.body_timeout),
        header_timeout: Duration::from_secs(args.header_timeout),
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout),
        handle_signals: true,
        strict_api: args.strict_api,
        cors_origins: args.cors_origin.clone(),
        responses_store: args.responses_store,
        webui: !args.no_webui,
        close_objects: match args.close_objects.as_str() {
            "strict" => CloseObjects::Strict,
            "all" => CloseObjects::All,
            _ => CloseObjects::Tools,
        },
        tool_parser: args
            .tool_parser
            .as_deref()
            .map(|n| ToolFormat::from_name(n).expect("clap checked the name")),
        memory_budget: args.memory_budget.map(|mib| mib.saturating_mul(1 << 20)),
        admin: !args.no_admin,
    };
    let addr = format!("{}:{}", args.host, args.port);
    let mut lm_options = args.run.model_options(&args.backend);
    lm_options.memory.kv = match (args.kv_blocks, args.kv_memory) {
        (Some(blocks), _) => KvBudget::Blocks(blocks as usize),
        (None, Some(mib)) => KvBudget::Bytes((mib as usize).saturating_mul(1 << 20)),
        (None, None) => KvBudget::Sequences(args.max_batch as usize),
    };
    lm_options.memory.prefix_cache = !args.no_prefix_cache;
    if !single {
        if args.embedding {
            return Err(crate::options::Usage(
                "--embedding serves one package; give one model (several models serve each \
                 encoder package as an embedding model by itself)"
                    .into(),
            )
            .into());
        }
        return serve_many(args, config, &addr, dirs, lm_options);
    }
    if args.embedding || oxgen::embed::is_encoder_package(&dir) {
        let options = args.encoder.options(args.run.threads, &args.backend);
        let open_dir = dir.clone();
        let server = Server::start_encoder(
            config,
            &addr,
            Box::new(move || models::open_encoder(&open_dir, &options)),
        )
        .map_err(anyhow::Error::msg)?;
        eprintln!(
            "oxgen serve: listening on http://{} (encoder {})",
            server.addr(),
            dir.display()
        );
        return server.wait().map_err(anyhow::Error::msg);
    }
    let options = lm_options;
    let open_dir = dir.clone();
    let server = Server::start(
        config,
        &addr,
        Box::new(move || {
            let model = models::open_lm(&open_dir, &options)?;
            if let Some((mode, _)) = model.speculation() {
                eprintln!(
                    "speculative decoding: {mode}, up to {} ids per step, in batches of up to \
                     {} sequences",
                    options.spec_tokens,
                    oxgen::SPEC_MAX_BATCH
                );
            }
            Ok(model)
        }),
    )
    .map_err(anyhow::Error::msg)?;
    eprintln!(
        "oxgen serve: listening on http://{} (model {})",
        server.addr(),
        dir.display()
    );
    server.wait().map_err(anyhow::Error::msg)
}

/// Several models: those named on the command line and every package in `--models`, each
/// loaded when a request first names it, under the memory budget.
fn serve_many(
    args: &Args,
    mut config: Config,
    addr: &str,
    dirs: Vec<std::path::PathBuf>,
    options: ModelOptions,
) -> anyhow::Result<()> {
    if !args.run.lora.is_empty() {
        bail!(
            "--lora adapts the one model served; with several, give each model's adapters in \
             the models folder's {} (\"lora\": {{\"NAME\": \"PATH\"}})",
            models::SETTINGS_FILE
        );
    }
    if args.model_id.is_some() || !args.alias.is_empty() {
        bail!(
            "--model-id and --alias name the one model served; with several, each is served \
             under its folder's name (aliases go in the models folder's {})",
            models::SETTINGS_FILE
        );
    }
    let budget = match config.memory_budget {
        Some(bytes) => bytes,
        None => default_memory_budget()
            .context("cannot tell how much memory the process may use; give --memory-budget MIB")?,
    };
    config.memory_budget = Some(budget);
    let folder = |dir: std::path::PathBuf| Folder {
        dir,
        options: options.clone(),
        encoder: args.encoder.options(args.run.threads, &args.backend),
        keep_alive: args.keep_alive,
    };
    let mut specs = Vec::new();
    for dir in &dirs {
        let name = (dir.canonicalize().unwrap_or_else(|_| dir.clone()))
            .file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned());
        let parent = dir.parent().unwrap_or(dir).to_path_buf();
        if !models::is_package(dir) {
            bail!("{}: not a package folder", dir.display());
        }
        specs.push(folder(parent).spec(name, dir.clone(), &Default::default())?);
    }
    let catalog = match &args.models {
        Some(dir) => {
            let catalog = folder(dir.clone());
            // Read once now: a bad settings file or folder is an error at start.
            use oxgen_server::Catalog;
            let found = catalog.scan().map_err(anyhow::Error::msg)?;
            eprintln!("oxgen serve: {} model(s) in {}", found.len(), dir.display());
            Some(Box::new(catalog) as Box<dyn oxgen_server::Catalog>)
        }
        None => None,
    };
    let server = Server::start_models(config, addr, specs, catalog).map_err(anyhow::Error::msg)?;
    eprintln!(
        "oxgen serve: listening on http://{} (models loaded on demand, memory budget {} MiB)",
        server.addr(),
        budget >> 20
    );
    server.wait().map_err(anyhow::Error::msg)
}

/// 3/4 of the memory this process may use: its cgroup's limit where one is set (a
/// container's, a Kubernetes pod's), else the machine's.
fn default_memory_budget() -> Option<u64> {
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .find_map(|s| s.trim().parse::<u64>().ok())
    // cgroup v1 writes a huge number for "no limit".
    .filter(|&b| b < (1 << 60));
    let physical = || {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kib = text.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
        let kib: u64 = kib.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    };
    let memory = cgroup.or_else(physical)?;
    Some(memory / 4 * 3)
}
