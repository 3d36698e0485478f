//! Chat templates: the Jinja template a package ships, rendered with minijinja.
//!
//! Hugging Face templates are written for Python's jinja2: they call string methods
//! (`.strip()`, `.startswith()`), `raise_exception(msg)` and sometimes `strftime_now(fmt)`.
//! minijinja-contrib's pycompat layer supplies the methods; the two functions are registered
//! here. Templates run sandboxed: minijinja has no file or network access, its recursion is
//! bounded, and a render gets a fuel budget of instructions ([`TEMPLATE_FUEL`]).

use std::path::Path;

use serde::Serialize;

use crate::GenerateError;
use crate::tools::{ToolCall, ToolFormat, ToolSet, messages_without_tools};

/// One chat message. An assistant message may carry the tool calls it made; a `tool`
/// message answers the call named by `tool_call_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

const TEMPLATE_NAME: &str = "chat";

/// Instructions a render may execute: templates are untrusted code (a package's, or
/// `--chat-template`'s), and a loop nest must not hold a thread forever. A chat of thousands
/// of messages needs a small fraction of it.
const TEMPLATE_FUEL: u64 = 20_000_000;

/// A special token in `tokenizer_config.json`: a string, or an object with `content`.
fn token_string(v: Option<&serde_json::Value>) -> String {
    match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Object(o)) => o
            .get("content")
            .and_then(|c| c.as_str())
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` / `eos_token` are exposed to it as variables.
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, GenerateError> {
        let mut env = minijinja::Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_function("strftime_now", |fmt: String| {
            jiff::Zoned::now().strftime(&fmt).to_string()
        });
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| GenerateError::Template(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// The chat template of a package folder: `chat_template` in `tokenizer_config.json` (a
    /// string, or named templates of which `default` is taken), else the `chat_template.jinja`
    /// file recent transformers versions save beside it; `bos_token` and `eos_token` from
    /// `tokenizer_config.json`. `Ok(None)` when the package has no template.
    pub fn from_package(dir: &Path) -> Result<Option<ChatTemplate>, GenerateError> {
        ChatTemplate::open(dir, None)
    }

    /// [`ChatTemplate::from_package`], with the template's text from `file` when given (the
    /// special tokens still come from the package).
    pub fn open(dir: &Path, file: Option<&Path>) -> Result<Option<ChatTemplate>, GenerateError> {
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Value = if config_path.exists() {
            let text = std::fs::read_to_string(&config_path).map_err(|e| {
                GenerateError::Template(format!("reading {}: {e}", config_path.display()))
            })?;
            serde_json::from_str(&text).map_err(|e| {
                GenerateError::Template(format!("{}: invalid JSON: {e}", config_path.display()))
            })?
        } else {
            serde_json::Value::Null
        };
        let in_config = match config.get("chat_template") {
            Some(serde_json::Value::String(t)) => Some(t.clone()),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(str::to_string),
            _ => None,
        };
        let jinja = file.map_or_else(|| dir.join("chat_template.jinja"), Path::to_path_buf);
        let (source, from) = match (file, in_config) {
            (None, Some(t)) => (t, config_path),
            (None, None) if !jinja.exists() => return Ok(None),
            // The file given, or the package's own when its config names none.
            _ => {
                let text = std::fs::read_to_string(&jinja).map_err(|e| {
                    GenerateError::Template(format!("reading {}: {e}", jinja.display()))
                })?;
                (text, jinja)
            }
        };
        let template = ChatTemplate::new(
            &source,
            &token_string(config.get("bos_token")),
            &token_string(config.get("eos_token")),
        )
        .map_err(|e| GenerateError::Template(format!("{}: {e}", from.display())))?;
        Ok(Some(template))
    }

    /// The template's Jinja text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt text for `messages`; `add_generation_prompt` opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, GenerateError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with tools: a template that renders tools gets them as
    /// `tools` (OpenAI's shape, as Hugging Face passes them; Phi-4-mini's reads them from the
    /// system message's `tools`), one in the [`ToolFormat::Json`] format gets them described
    /// in the system message instead.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&ToolSet>,
        add_generation_prompt: bool,
    ) -> Result<String, GenerateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| GenerateError::Template(e.to_string()))?;
        let rewritten;
        let messages = match tools {
            Some(set) if set.format == ToolFormat::Json => {
                rewritten = messages_without_tools(messages, &set.tools, &set.choice);
                &rewritten[..]
            }
            _ => messages,
        };
        let mut list = serde_json::to_value(messages)
            .map_err(|e| GenerateError::Template(format!("messages: {e}")))?;
        let tools_json = tools
            .filter(|set| set.format != ToolFormat::Json)
            .map(|set| set.tools.iter().map(|t| t.to_json()).collect::<Vec<_>>());
        if let (Some(set), Some(list)) = (tools, list.as_array_mut())
            && set.format == ToolFormat::Phi4Mini
        {
            let functions: Vec<serde_json::Value> = (set.tools.iter())
                .map(|t| t.to_json()["function"].clone())
                .collect();
            if list.first().is_none_or(|m| m["role"] != "system") {
                list.insert(0, serde_json::json!({"role": "system", "content": ""}));
            }
            list[0]["tools"] = serde_json::Value::Array(functions).to_string().into();
        }
        template
            .render(minijinja::context! {
                messages => minijinja::Value::from(minijinja::value::Serde(&list)),
                tools => tools_json.map(|t| minijinja::Value::from(minijinja::value::Serde(t))),
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| GenerateError::Template(format!("rendering: {e}")))
    }
}
