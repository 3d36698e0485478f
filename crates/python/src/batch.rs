//! `generate_batch`: each prompt a request to one engine, as the server runs them.

use std::sync::Arc;
use std::time::Instant;

use oxgen::engine::Limits;
use oxgen::{Cancel, Engine, EngineStatus, Event, Job, JobPrompt, Model as Inner, Output};
use pyo3::prelude::*;

use crate::args::Ready;
use crate::{GenerationError, error};

/// Where one prompt's events go: tagged with the prompt, closed once the batch is
/// cancelled (the engine then drops what is left of it).
struct Tagged {
    prompt: usize,
    events: std::sync::mpsc::Sender<(usize, Event)>,
    cancel: Cancel,
}

impl oxgen::engine::Sink for Tagged {
    fn send(&self, event: Event) {
        let _ = self.events.send((self.prompt, event));
    }

    fn is_closed(&self) -> bool {
        self.cancel.is_cancelled()
    }
}

/// Runs each prompt of `ready` as a request to one [`Engine`] (the server's scheduler: as
/// many at once as `limits` and the KV pool allow, one forward per step over them all)
/// until every one finishes or `cancel` is set.
pub(crate) fn batch(
    model: &mut Inner,
    limits: Limits,
    ready: &Ready,
    cancel: &Cancel,
) -> PyResult<Vec<Output>> {
    let started = Instant::now();
    let limit = model.context_limit();
    let mut engine = Engine::new(limits, Arc::new(EngineStatus::default()));
    let (events, received) = std::sync::mpsc::channel();
    for (prompt, ids) in ready.ids.iter().enumerate() {
        let sizing = (limit.size(ids.len(), ready.options.max_new_tokens)).map_err(error)?;
        engine.submit(Job {
            prompts: vec![JobPrompt {
                ids: ids.clone(),
                positions: sizing.positions,
            }],
            options: ready.options.clone(),
            n: 1,
            top_logprobs: None,
            prompt_logprobs: None,
            arrived: started,
            deadline: None,
            events: Box::new(Tagged {
                prompt,
                events: events.clone(),
                cancel: cancel.clone(),
            }),
        });
    }
    while !engine.idle() {
        engine.turn(model);
    }
    let total = started.elapsed();
    let mut outputs: Vec<Output> = (ready.ids.iter())
        .map(|ids| Output {
            text: String::new(),
            tokens: Vec::new(),
            usage: oxgen::Usage {
                prompt_tokens: ids.len(),
                ..Default::default()
            },
            finish_reason: oxgen::FinishReason::Cancelled,
            timings: oxgen::Timings {
                total,
                ..Default::default()
            },
        })
        .collect();
    for (prompt, event) in received.try_iter() {
        let out = &mut outputs[prompt];
        match event {
            Event::Token { step, .. } => {
                out.text.push_str(&step.text);
                out.tokens.push(step.id);
                out.usage.completion_tokens += 1;
                if let Some(finish) = step.finish {
                    out.finish_reason = finish;
                }
            }
            Event::Done(counts) => out.usage.prefix_reused = counts.cached_tokens,
            Event::Error(e) => return Err(GenerationError::new_err(e.to_string())),
            Event::PromptLogprobs { .. } => {}
        }
    }
    Ok(outputs)
}
