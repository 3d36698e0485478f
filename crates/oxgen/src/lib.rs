//! oxgen: run generative AI models stored as ONNX.
//!
//! ```no_run
//! use oxgen::{Model, ModelOptions, Prompt, GenerateOptions};
//!
//! let mut model = Model::open("path/to/package", &ModelOptions::default())?;
//! let prompt = Prompt::chat(&[("user", "Why is the sky blue?")]);
//! let out = model.generate(&prompt, &GenerateOptions::default(), |text| print!("{text}"))?;
//! eprintln!("{} tokens", out.tokens.len());
//! # Ok::<(), oxgen::Error>(())
//! ```
//!
//! A package folder holds `model.onnx` (onnxruntime-genai layout: `genai_config.json`,
//! `tokenizer.json`, `tokenizer_config.json`). The model's I/O contract comes from the graph
//! and the config files, never from its name. This crate is the only one that picks a
//! backend.

mod package;

use std::path::Path;

use oxgen_exec::{ExecOptions, NativeLm};
use oxgen_generate::{ChatMessage, ChatTemplate, Detokenizer, Tokenizer};
pub use oxgen_generate::{Generated, StopReason};
use oxgen_runtime::LanguageModel;
pub use package::PackageConfig;

/// Errors from opening a model or generating with it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {reason}")]
    Package { path: String, reason: String },
    #[error("loading {path}: {source}")]
    Onnx {
        path: String,
        source: Box<oxgen_onnx::OnnxError>,
    },
    #[error("loading {path}: {source}")]
    Graph {
        path: String,
        source: Box<oxgen_graph::GraphError>,
    },
    #[error(transparent)]
    Runtime(#[from] oxgen_runtime::RuntimeError),
    #[error(transparent)]
    Generate(#[from] oxgen_generate::GenerateError),
}

/// How to open a model.
#[derive(Debug, Clone, Default)]
pub struct ModelOptions {
    /// Kernel threads; 0 uses every core.
    pub threads: usize,
    /// Context to size KV for; `None` takes the package's `context_length`.
    pub context: Option<usize>,
    /// f32 activations whatever the model's `accuracy_level` allows (no int8 activations).
    pub exact: bool,
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// Keep generating past end-of-sequence tokens (their logits are masked).
    pub ignore_eos: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 256,
            ignore_eos: false,
        }
    }
}

/// A prompt: chat messages rendered with the package's template, raw text, or token ids.
#[derive(Debug, Clone)]
pub enum Prompt {
    Chat(Vec<ChatMessage>),
    Text(String),
    Tokens(Vec<u32>),
}

impl Prompt {
    /// Chat messages from `(role, content)` pairs.
    pub fn chat(messages: &[(&str, &str)]) -> Prompt {
        Prompt::Chat(
            messages
                .iter()
                .map(|(r, c)| ChatMessage::new(r, c))
                .collect(),
        )
    }
}

/// A loaded model with its tokenizer and chat template.
pub struct Model {
    lm: NativeLm,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    config: PackageConfig,
    context: usize,
}

impl Model {
    /// Opens a package folder (or its `model.onnx`).
    pub fn open(path: impl AsRef<Path>, options: &ModelOptions) -> Result<Model, Error> {
        let path = path.as_ref();
        let dir = if path.is_dir() {
            path.to_path_buf()
        } else {
            path.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        let config = PackageConfig::read(&dir)?;
        let model_path = dir.join(&config.model_file);
        let shown = model_path.display().to_string();
        let onnx = oxgen_onnx::Model::load(&model_path).map_err(|e| Error::Onnx {
            path: shown.clone(),
            source: Box::new(e),
        })?;
        let graph = oxgen_graph::Graph::from_model(&onnx).map_err(|e| Error::Graph {
            path: shown.clone(),
            source: Box::new(e),
        })?;
        let lm = NativeLm::new(
            graph,
            &ExecOptions {
                threads: options.threads,
                exact: options.exact,
            },
            &config.kv,
        )?;
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        let tokenizer_config = dir.join("tokenizer_config.json");
        let template = if tokenizer_config.exists() {
            ChatTemplate::from_tokenizer_config(&tokenizer_config)?
        } else {
            None
        };
        let context = options
            .context
            .unwrap_or(config.context_length)
            .min(config.context_length);
        Ok(Model {
            lm,
            tokenizer,
            template,
            config,
            context,
        })
    }

    pub fn config(&self) -> &PackageConfig {
        &self.config
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The token ids a prompt becomes.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>, Error> {
        match prompt {
            Prompt::Tokens(ids) => Ok(ids.clone()),
            Prompt::Text(text) => Ok(self.tokenizer.encode(text, false)?),
            Prompt::Chat(messages) => {
                let template = self.template.as_ref().ok_or_else(|| Error::Package {
                    path: "tokenizer_config.json".into(),
                    reason: "the package has no chat_template; send the prompt as raw text".into(),
                })?;
                let text = template.render(messages, true)?;
                Ok(self.tokenizer.encode(&text, false)?)
            }
        }
    }

    /// Generates greedily, calling `on_text` with each complete piece of text.
    pub fn generate(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
        mut on_text: impl FnMut(&str),
    ) -> Result<Generated, Error> {
        let ids = self.encode(prompt)?;
        let decode = oxgen_generate::GenerateOptions {
            max_new_tokens: options.max_new_tokens,
            eos: self.config.eos_token_ids.clone(),
            ignore_eos: options.ignore_eos,
            context: self.context,
        };
        let mut detok = Detokenizer::new(true);
        let tokenizer = &self.tokenizer;
        let mut text_error = None;
        let lm: &mut dyn LanguageModel = &mut self.lm;
        let out = oxgen_generate::generate_greedy(lm, &ids, &decode, |id| {
            match detok.push(tokenizer, id) {
                Ok(piece) => {
                    on_text(&piece);
                    true
                }
                Err(e) => {
                    text_error = Some(e);
                    false
                }
            }
        })?;
        if let Some(e) = text_error {
            return Err(e.into());
        }
        on_text(&detok.flush(tokenizer)?);
        Ok(out)
    }
}
