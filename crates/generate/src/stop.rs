//! Stop strings over streamed text.
//!
//! Text arrives in pieces (one per detokenized token) and a stop string can straddle them.
//! [`StopStrings`] emits each piece at once except for a tail that could still grow into a
//! stop string, which it holds back until it either completes one (generation stops; the
//! stop string itself is never emitted) or stops matching (the text is released).
//!
//! **Which stop wins.** A stop matches as soon as it is complete in the text: the winner is
//! the occurrence that *ends* first; among occurrences ending at the same byte, the one that
//! starts first (the longest); among identical stop strings, the first listed. Deciding by
//! end rather than by start makes the result independent of how the text is cut into
//! pieces: `["abcd", "bc"]` on "abcd" always stops at "bc" with "a" emitted, whether "abcd"
//! arrives whole or a byte at a time, just as generation would have stopped at the token
//! that completed "bc".
//!
//! Pieces are `&str`, so a held-back tail always ends on a character boundary and emitted
//! text never splits a UTF-8 character. Memory is the held tail plus one piece: the buffer
//! never grows beyond that.

/// Holds back streamed text that might begin a stop string; stop strings are not emitted.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    /// The stop strings, empty ones removed; `which` indexes the list given to `new`.
    stops: Vec<(usize, String)>,
    /// Bytes `..emitted` were handed out by the last call; the rest is held back.
    buf: String,
    emitted: usize,
    /// Set once a stop matched: the stream is over until `reset`.
    stopped: Option<usize>,
}

/// What to do after a piece of text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCheck<'a> {
    /// Text safe to emit now (may be empty); keep generating.
    Continue(&'a str),
    /// A stop string matched: emit `text` (what precedes the stop string), then stop.
    /// `which` is the stop string's index in the list given to [`StopStrings::new`].
    Stop { text: &'a str, which: usize },
}

impl StopStrings {
    /// Empty strings are ignored (they would match everywhere); indices in
    /// [`StopCheck::Stop`] still refer to `stops` as given.
    pub fn new(stops: Vec<String>) -> StopStrings {
        StopStrings {
            stops: stops
                .into_iter()
                .enumerate()
                .filter(|(_, s)| !s.is_empty())
                .collect(),
            ..StopStrings::default()
        }
    }

    /// True when there is no (non-empty) stop string: every piece passes straight through.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Feeds a decoded piece of text. After a `Stop`, every further piece is dropped and
    /// answered with the same `Stop` and empty text.
    pub fn push(&mut self, piece: &str) -> StopCheck<'_> {
        if let Some(which) = self.stopped {
            return StopCheck::Stop { text: "", which };
        }
        self.buf.drain(..self.emitted);
        self.emitted = 0;
        self.buf.push_str(piece);
        if let Some((start, which)) = self.first_match() {
            self.stopped = Some(which);
            self.emitted = self.buf.len();
            return StopCheck::Stop {
                text: &self.buf[..start],
                which,
            };
        }
        self.emitted = self.held_from();
        StopCheck::Continue(&self.buf[..self.emitted])
    }

    /// End of generation without a stop: the held-back text, to emit last.
    pub fn finish(&mut self) -> &str {
        if self.stopped.is_some() {
            return "";
        }
        self.buf.drain(..self.emitted);
        self.emitted = self.buf.len();
        &self.buf
    }

    /// Forgets held text and any stop, keeping the stop strings (for the next sequence).
    pub fn reset(&mut self) {
        self.buf.clear();
        self.emitted = 0;
        self.stopped = None;
    }

    /// The winning occurrence in `buf` as `(start, which)`: earliest end, then earliest
    /// start, then first listed. Held text never holds a whole stop string, so every
    /// occurrence found ends in the newest piece.
    fn first_match(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .filter_map(|(which, stop)| {
                let start = self.buf.find(stop.as_str())?;
                Some((start + stop.len(), start, *which))
            })
            .min()
            .map(|(_, start, which)| (start, which))
    }

    /// Start of the longest tail of `buf` that is a proper prefix of some stop string
    /// (`buf.len()` when none): text from there on is held back.
    fn held_from(&self) -> usize {
        let longest = self.stops.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
        // A proper prefix is shorter than its stop string.
        let earliest = self.buf.len().saturating_sub(longest.saturating_sub(1));
        (earliest..self.buf.len())
            .filter(|&i| self.buf.is_char_boundary(i))
            .find(|&i| {
                let tail = &self.buf[i..];
                self.stops.iter().any(|(_, s)| s.starts_with(tail))
            })
            .unwrap_or(self.buf.len())
    }
}
