//! A conversation: its messages, rendered with the package's template each turn. The model
//! keeps the KV of the last generation, so a turn prefills only what it adds to the
//! conversation so far.

use crate::{ChatMessage, Error, GenerateOptions, Model, Output, Prompt};

/// Positions a conversation's KV holds where the caller does not say (`oxgen run`, the
/// Python package): a fixed size, so each turn fits the KV of the turns before it and only
/// prefills what it adds (clamped to the model's context like any `ctx_size`).
pub const CHAT_CTX_SIZE: usize = 4096;

/// The messages of a chat, with an optional system prompt.
///
/// ```no_run
/// use oxgen::{Chat, Model, ModelOptions};
///
/// let mut model = Model::open("path/to/package", &ModelOptions::default())?;
/// let options = model.default_options();
/// let mut chat = Chat::new(Some("You are terse."));
/// chat.send(&mut model, "Name a color.", &options, |t| print!("{t}"))?;
/// let out = chat.send(&mut model, "Another one.", &options, |t| print!("{t}"))?;
/// // The second turn prefilled only its own tokens.
/// assert!(out.usage.prefix_reused > 0);
/// # Ok::<(), oxgen::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Chat {
    system: Option<String>,
    messages: Vec<ChatMessage>,
}

impl Chat {
    pub fn new(system: Option<&str>) -> Chat {
        Chat {
            system: system.map(str::to_string),
            messages: Vec::new(),
        }
    }

    /// Replaces the system prompt (the conversation goes on).
    pub fn set_system(&mut self, system: Option<&str>) {
        self.system = system.map(str::to_string);
    }

    /// Forgets the messages; the system prompt stays.
    pub fn clear(&mut self) {
        self.messages.clear();
    }

    /// The user and assistant messages so far.
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// Every message the template sees, system prompt first.
    pub fn prompt(&self) -> Prompt {
        let system = self.system.iter().map(|s| ChatMessage::new("system", s));
        Prompt::Chat(system.chain(self.messages.iter().cloned()).collect())
    }

    /// Adds `user`, generates the reply (streamed to `on_text`) and adds it. A reply that
    /// fails leaves the conversation as it was.
    pub fn send(
        &mut self,
        model: &mut Model,
        user: &str,
        options: &GenerateOptions,
        on_text: impl FnMut(&str),
    ) -> Result<Output, Error> {
        self.messages.push(ChatMessage::new("user", user));
        match model.generate(&self.prompt(), options, on_text) {
            Ok(out) => {
                self.messages.push(ChatMessage::new("assistant", &out.text));
                Ok(out)
            }
            Err(e) => {
                self.messages.pop();
                Err(e)
            }
        }
    }
}
