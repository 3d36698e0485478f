//! Chat templates: the Jinja template a package ships, rendered with minijinja.
//!
//! Hugging Face templates are written for Python's jinja2: they call string methods
//! (`.strip()`, `.startswith()`), `raise_exception(msg)` and sometimes `strftime_now(fmt)`.
//! minijinja-contrib's pycompat layer supplies the methods; the two functions are registered
//! here.

use std::path::Path;

use serde::Serialize;

use crate::GenerateError;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const TEMPLATE_NAME: &str = "chat";

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
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// Reads `chat_template`, `bos_token` and `eos_token` from a `tokenizer_config.json`.
    /// `Ok(None)` when the file has no template.
    pub fn from_tokenizer_config(path: &Path) -> Result<Option<ChatTemplate>, GenerateError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| GenerateError::Template(format!("reading {}: {e}", path.display())))?;
        let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            GenerateError::Template(format!("{}: invalid JSON: {e}", path.display()))
        })?;
        let Some(source) = config.get("chat_template").and_then(|t| t.as_str()) else {
            return Ok(None);
        };
        let template = ChatTemplate::new(
            source,
            &token_string(config.get("bos_token")),
            &token_string(config.get("eos_token")),
        )
        .map_err(|e| GenerateError::Template(format!("{}: {e}", path.display())))?;
        Ok(Some(template))
    }

    /// The prompt text for `messages`; `add_generation_prompt` opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, GenerateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| GenerateError::Template(e.to_string()))?;
        template
            .render(minijinja::context! {
                messages => minijinja::Value::from(minijinja::value::Serde(messages)),
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| GenerateError::Template(format!("rendering: {e}")))
    }
}
