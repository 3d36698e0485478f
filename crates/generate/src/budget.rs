//! A budget on reasoning tokens: once a reply has spent it inside its reasoning block
//! (`<think>...</think>`, or gpt-oss's analysis channel), the ids that close the block are
//! forced, one per step, and the answer follows. As vLLM's `thinking_token_budget` and
//! llama.cpp's reasoning budget do, the closing ids are chosen instead of sampled (each still
//! passes through the sampler's `accept`, so a grammar over the whole reply sees them); the
//! model then continues from a reply whose reasoning it ended.

/// What bounds a reply's reasoning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningBudget {
    /// Tokens the reasoning block may hold (counted from its first token on; 0: close it at
    /// once).
    pub tokens: usize,
    /// The text that opens the block (a reply that begins with it reasons).
    pub open: String,
    /// The text that closes it, and the ids forced to close it.
    pub close: String,
    pub close_ids: Vec<u32>,
    /// The prompt already opened the block: the reply starts inside it.
    pub inside: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not yet known whether the reply opens the block: what it said so far is a prefix of
    /// `open` (after blanks).
    Before,
    Inside,
    /// Closing: this many of `close_ids` were forced.
    Closing(usize),
    /// The block closed (or never opened): nothing more to do.
    Done,
}

/// A sequence's reasoning budget as it generates.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    budget: ReasoningBudget,
    state: State,
    spent: usize,
    /// The reply's text while it may still open or close the block (as long as `open` or
    /// `close` are), to find the markers across token boundaries.
    window: String,
}

impl Budget {
    pub fn new(budget: ReasoningBudget) -> Budget {
        let state = if budget.inside {
            State::Inside
        } else {
            State::Before
        };
        let window = String::with_capacity(2 * budget.open.len().max(budget.close.len()) + 64);
        Budget {
            budget,
            state,
            spent: 0,
            window,
        }
    }

    /// The id to emit instead of sampling, when the budget is spent.
    pub fn forced(&self) -> Option<u32> {
        match self.state {
            State::Inside if self.spent >= self.budget.tokens => self.budget.close_ids.first(),
            State::Closing(n) => self.budget.close_ids.get(n),
            _ => None,
        }
        .copied()
    }

    /// Records an emitted id and the text it released.
    pub fn on_token(&mut self, id: u32, text: &str) {
        match self.state {
            State::Done => {}
            State::Closing(_) | State::Inside if self.forced() == Some(id) => {
                let n = match self.state {
                    State::Closing(n) => n + 1,
                    _ => 1,
                };
                self.state = if n >= self.budget.close_ids.len() {
                    State::Done
                } else {
                    State::Closing(n)
                };
            }
            State::Closing(_) => self.state = State::Done,
            State::Before => {
                self.window.push_str(text);
                let said = self.window.trim_start();
                if said.starts_with(&self.budget.open) {
                    self.state = State::Inside;
                    self.spent = 1;
                    self.window.clear();
                } else if !said.is_empty() && !self.budget.open.starts_with(said) {
                    self.state = State::Done;
                }
            }
            State::Inside => {
                self.spent += 1;
                self.window.push_str(text);
                if self.window.contains(&self.budget.close) {
                    self.state = State::Done;
                    return;
                }
                // Keep only what may begin the closing marker.
                let keep = self.budget.close.len().saturating_sub(1);
                if self.window.len() > keep {
                    let mut cut = self.window.len() - keep;
                    while !self.window.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    self.window.drain(..cut);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(tokens: usize, inside: bool) -> Budget {
        Budget::new(ReasoningBudget {
            tokens,
            open: "<think>".into(),
            close: "</think>".into(),
            close_ids: vec![7, 8],
            inside,
        })
    }

    #[test]
    fn forces_the_closing_ids_once_the_budget_is_spent() {
        let mut b = budget(3, false);
        assert_eq!(b.forced(), None);
        b.on_token(1, "<th");
        b.on_token(2, "ink>");
        assert_eq!(b.state, State::Inside);
        b.on_token(3, "hmm");
        assert_eq!(b.forced(), None);
        b.on_token(4, " so");
        assert_eq!(b.forced(), Some(7));
        b.on_token(7, "</");
        assert_eq!(b.forced(), Some(8));
        b.on_token(8, "think>");
        assert_eq!(b.forced(), None);
        b.on_token(5, "answer");
        assert_eq!(b.forced(), None);
    }

    #[test]
    fn a_block_closed_by_the_model_or_never_opened_costs_nothing() {
        let mut b = budget(4, true);
        b.on_token(1, "a</th");
        b.on_token(2, "ink>");
        assert_eq!(b.state, State::Done);
        let mut b = budget(0, false);
        b.on_token(1, "  Hello");
        assert_eq!((b.state, b.forced()), (State::Done, None));
        // Inside from the prompt with nothing to spend: closed at once.
        assert_eq!(budget(0, true).forced(), Some(7));
    }
}
