//! Prompts to token ids and back, shareable across threads (a server tokenizes requests on
//! its HTTP threads while the model runs elsewhere).

use std::sync::Arc;

use oxgen_generate::{ChatMessage, ChatTemplate, Tokenizer, ToolFormat, ToolSet};

use crate::{Error, Prompt};

/// A package's tokenizer and chat template; cloning shares them.
#[derive(Clone)]
pub struct Encoder {
    tokenizer: Arc<Tokenizer>,
    template: Option<Arc<ChatTemplate>>,
}

impl Encoder {
    pub(crate) fn new(tokenizer: Tokenizer, template: Option<ChatTemplate>) -> Encoder {
        Encoder {
            tokenizer: Arc::new(tokenizer),
            template: template.map(Arc::new),
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The tokenizer, shared.
    pub fn shared_tokenizer(&self) -> Arc<Tokenizer> {
        self.tokenizer.clone()
    }

    /// The package's chat template, if it has one.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_deref()
    }

    /// The tool-call format the chat template implies ([`ToolFormat::detect`]).
    pub fn tool_format(&self) -> ToolFormat {
        ToolFormat::detect(self.template().map(ChatTemplate::source))
    }

    /// The token ids a prompt becomes.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>, Error> {
        match prompt {
            Prompt::Tokens(ids) => Ok(ids.clone()),
            Prompt::Text(text) => Ok(self.tokenizer.encode(text, false)?),
            Prompt::Chat(messages) => {
                let text = self.render(messages, None)?;
                Ok(self.tokenizer.encode(&text, false)?)
            }
        }
    }

    /// The prompt text of a conversation, with the tools it offers, opening the assistant's
    /// turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&ToolSet>,
    ) -> Result<String, Error> {
        self.render_with(messages, tools, &serde_json::Map::new(), true)
    }

    /// [`Encoder::render`] with extra arguments for the template (`chat_template_kwargs`),
    /// over the model's defaults ([`crate::ModelOptions::chat_template_kwargs`]), opening the
    /// assistant's turn only with `add_generation_prompt`.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&ToolSet>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let template = self.template.as_ref().ok_or_else(|| Error::Package {
            path: "tokenizer_config.json".into(),
            reason: "the package has no chat_template; send the prompt as raw text".into(),
        })?;
        Ok(template.render_with(messages, tools, add_generation_prompt, kwargs)?)
    }

    /// The text of `ids`, special tokens included unless `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, Error> {
        Ok(self.tokenizer.decode(ids, skip_special)?)
    }

    /// The raw bytes token `id` stands for (see [`Tokenizer::token_bytes`]).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.tokenizer.token_bytes(id)
    }
}
