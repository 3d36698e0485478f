//! How many positions a sequence holds: the one place that clamps `ctx_size` to the
//! package's context length and checks that a prompt leaves room to generate.

use crate::{Error, GenerateError};

/// The positions sequences may hold: [`crate::MemoryOptions::ctx_size`] clamped to the
/// package's context length, or that context length. Copied to the threads that size
/// requests (a server's HTTP side) so they decide as the model does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextLimit {
    /// The ctx_size asked for, clamped.
    ctx_size: Option<usize>,
    context_length: usize,
}

/// A request sized to fit: the tokens it may generate and the positions its KV holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// The tokens asked for, at most the room the prompt leaves.
    pub max_new_tokens: usize,
    /// The prompt and `max_new_tokens` (at least one): a batch sequence's KV.
    pub positions: usize,
}

impl ContextLimit {
    pub fn new(ctx_size: Option<usize>, context_length: usize) -> ContextLimit {
        ContextLimit {
            ctx_size: ctx_size.map(|c| c.min(context_length)),
            context_length,
        }
    }

    /// The most positions one sequence may hold.
    pub fn max(&self) -> usize {
        self.ctx_size.unwrap_or(self.context_length)
    }

    /// The ctx_size asked for (clamped), if any: the size of the sequence a model keeps for
    /// the next prompt, so that a conversation's later turns fit in it.
    pub fn ctx_size(&self) -> Option<usize> {
        self.ctx_size
    }

    /// The package's context length.
    pub fn context_length(&self) -> usize {
        self.context_length
    }

    /// Sizes a request of `prompt_len` ids asking for `max_new_tokens`; fails when the prompt
    /// leaves no room to generate.
    pub fn size(&self, prompt_len: usize, max_new_tokens: usize) -> Result<Sizing, Error> {
        let max = self.max();
        if prompt_len >= max {
            return Err(GenerateError::PromptTooLong {
                prompt_tokens: prompt_len,
                ctx_size: max,
                context_length: self.context_length,
            }
            .into());
        }
        let max_new_tokens = max_new_tokens.min(max - prompt_len);
        Ok(Sizing {
            max_new_tokens,
            positions: prompt_len + max_new_tokens.max(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamps_once_and_leaves_room_to_generate() {
        let limit = ContextLimit::new(Some(100_000), 2048);
        assert_eq!(limit.max(), 2048);
        assert_eq!(limit.ctx_size(), Some(2048));
        let s = limit.size(2000, 4096).unwrap();
        assert_eq!((s.max_new_tokens, s.positions), (48, 2048));
        let s = limit.size(10, 0).unwrap();
        assert_eq!((s.max_new_tokens, s.positions), (0, 11));
        let open = ContextLimit::new(None, 64);
        assert_eq!((open.max(), open.ctx_size()), (64, None));
        let e = open.size(64, 1).unwrap_err().to_string();
        assert!(
            e.contains("64 tokens") && e.contains("context holds 64"),
            "{e}"
        );
    }
}
