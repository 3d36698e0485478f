//! The endpoints: OpenAI's completion APIs, models, tokenize/detokenize, health, metrics.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use oxgen::{
    ChatMessage, Constraint, Grammar, Logprobs, Prompt, Reply, ReplyDelta, ReplyParser,
    ReplySyntax, ToolChoice, ToolSet, after_reasoning, tool_grammar,
};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::api::{self, Bounds};
use crate::engine::{Event, Job};
use crate::error::ApiError;
use crate::{App, Loaded, Phase};

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(app.clone(), guard))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::method_not_allowed(method.as_str(), uri.path())
        })
        .with_state(app)
}

/// Checks the API key (all but `/health`) and counts responses by endpoint and status.
async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("other".to_string(), |m| m.as_str().to_string());
    let response = match &app.config.api_key {
        Some(key) if endpoint != "/health" && !authorized(request.headers(), key) => {
            ApiError::unauthorized(
                "missing or wrong API key: send 'Authorization: Bearer KEY' with the server's --api-key",
            )
            .into_response()
        }
        _ => next.run(request).await,
    };
    app.metrics
        .count_request(&endpoint, response.status().as_u16());
    response
}

/// `Authorization: Bearer KEY`, compared in constant time.
fn authorized(headers: &HeaderMap, key: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    given.len() == key.len()
        && given
            .bytes()
            .zip(key.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The body: 413 over the limit, 400 when it cannot be read (the client sent less than it
/// declared, or bad chunked encoding), 408 when it takes over `timeout` (so a client that
/// sends it a byte at a time cannot hold a connection forever).
async fn body(request: Request, limit: usize, timeout: Duration) -> Result<Vec<u8>, ApiError> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let read = async {
        let mut data = request.into_body().into_data_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = data.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::invalid("", format!("could not read the request body: {e}"))
            })?;
            if bytes.len() + chunk.len() > limit {
                return Err(ApiError::too_large(limit));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or_else(|_| Err(ApiError::body_timeout(timeout)))
}

/// A chat template's refusal is a 422; anything else about the prompt a 400.
fn prompt_error(e: oxgen::Error) -> ApiError {
    match e {
        oxgen::Error::Generate(oxgen::GenerateError::Template(m)) => {
            ApiError::unprocessable(format!("the chat template refused the messages: {m}"))
        }
        other => ApiError::invalid("", other.to_string()),
    }
}

/// The ids of `prompt`, tokenized on the runtime's blocking thread so that a huge prompt
/// does not hold up the worker answering every other connection. A chat template that
/// refuses the messages is a 422.
async fn encode(loaded: &Loaded, prompt: Prompt) -> Result<Vec<u32>, ApiError> {
    if let Prompt::Tokens(ids) = prompt {
        return Ok(ids);
    }
    let encoder = loaded.encoder.clone();
    tokio::task::spawn_blocking(move || encoder.encode(&prompt))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing the prompt failed: {e}")))?
        .map_err(prompt_error)
}

/// A conversation rendered with its tools, and its ids (as [`encode`]).
async fn encode_chat(
    loaded: &Loaded,
    messages: Vec<ChatMessage>,
    tools: Option<ToolSet>,
    kwargs: Map<String, Value>,
) -> Result<(Vec<u32>, String), ApiError> {
    let encoder = loaded.encoder.clone();
    tokio::task::spawn_blocking(move || {
        let text = encoder.render_with(&messages, tools.as_ref(), &kwargs)?;
        let ids = encoder.encode(&Prompt::Text(text.clone()))?;
        Ok((ids, text))
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing the prompt failed: {e}")))?
    .map_err(prompt_error)
}

/// Compiles a request's constraint off the HTTP worker; one that does not compile is a 400
/// naming the field that gave it, before anything is queued. For a tool grammar that is the
/// first tool whose parameters do not compile alone.
async fn compile(
    loaded: &Loaded,
    param: String,
    c: Constraint,
    tools: Option<ToolSet>,
) -> Result<Grammar, ApiError> {
    let grammars = match &loaded.grammars {
        Ok(g) => g.clone(),
        Err(e) => return Err(ApiError::invalid(param, e.clone())),
    };
    tokio::task::spawn_blocking(move || {
        grammars.compile(&c).map_err(|e| {
            let culprit =
                (tools.iter().flat_map(|set| set.tools.iter().enumerate())).find_map(|(i, t)| {
                    let alone = Constraint::JsonSchema(t.parameters.clone());
                    let e = grammars.compile(&alone).err()?;
                    Some((format!("tools[{i}].function.parameters"), e))
                });
            culprit.unwrap_or((param, e))
        })
    })
    .await
    .map_err(|e| ApiError::internal(format!("compiling the constraint failed: {e}")))?
    .map_err(|(param, e)| ApiError::invalid(param, e.to_string()))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A response id: the endpoint's prefix and 24 hex digits.
fn response_id(prefix: &str) -> String {
    use std::hash::{BuildHasher, RandomState};
    let a = RandomState::new().hash_one(Instant::now());
    let b = RandomState::new().hash_one(a);
    format!("{prefix}-{a:016x}{:08x}", b as u32)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// A request on its way: what the response needs besides the engine's events.
struct Pending {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    n: usize,
    stream: bool,
    include_usage: bool,
    logprobs: bool,
    events: UnboundedReceiver<Event>,
    encoder: oxgen::Encoder,
    /// How a chat reply is taken apart (reasoning, tool calls); `None`: all content.
    syntax: Option<ReplySyntax>,
}

impl App {
    fn bounds<'a>(&self, loaded: &'a Loaded) -> Bounds<'a> {
        Bounds {
            defaults: &loaded.sampling,
            vocab: loaded.vocab,
            max_n: self.config.max_batch,
            max_tokens_limit: self.config.max_tokens_limit,
        }
    }

    /// Tokenizes, sizes and queues a request.
    async fn submit(&self, kind: Kind, mut req: api::Request) -> Result<Pending, ApiError> {
        if !self.model_names().contains(&req.model) {
            return Err(ApiError::model_not_found(&req.model, &self.model_names()));
        }
        // Again: a shutdown may have begun while the body arrived.
        let loaded = self.ready()?;
        let prompt = std::mem::replace(&mut req.prompt, Prompt::Tokens(Vec::new()));
        let tools = req.tools.take().map(|t| t.with_format(loaded.tool_format));
        let (ids, syntax) = match prompt {
            Prompt::Chat(messages) => {
                let kwargs = std::mem::take(&mut req.template_kwargs);
                let (ids, text) = encode_chat(loaded, messages, tools.clone(), kwargs).await?;
                let calls = (tools.as_ref())
                    .filter(|t| t.choice != ToolChoice::None)
                    .map(|t| t.format);
                let template = loaded.encoder.template().map_or("", |t| t.source());
                let syntax = ReplySyntax::of_template(template, &text, calls);
                (ids, (!syntax.is_plain()).then_some(syntax))
            }
            prompt => (encode(loaded, prompt).await?, None),
        };
        // With reasoning first, only the answer is constrained.
        let tokenizer = loaded.encoder.tokenizer();
        let reasoned = |c| match &syntax {
            Some(s) => after_reasoning(c, s, tokenizer),
            None => c,
        };
        let answer = req.constraint.take();
        let calls = (tools.as_ref())
            .and_then(|set| tool_grammar(set, answer.as_ref().map(|(_, c)| c), tokenizer));
        let grammar = match calls {
            // gpt-oss's tool grammar allows the analysis message itself.
            Some(c) if syntax.is_some_and(|s| s.harmony) => Some(("tools".to_string(), c)),
            Some(c) => Some(("tools".to_string(), reasoned(c))),
            None => answer.map(|(param, c)| (param, reasoned(c))),
        };
        if let Some((param, c)) = grammar {
            req.options.constraint = Some(compile(loaded, param, c, tools).await?);
        }
        req.options.keep_special =
            syntax.is_some_and(|s| s.harmony || s.tools.is_some_and(|f| f.keeps_special()));
        let param = if kind == Kind::Chat {
            "messages"
        } else {
            "prompt"
        };
        if ids.is_empty() {
            return Err(ApiError::invalid(param, "the prompt has no tokens"));
        }
        let asked = req.max_tokens.unwrap_or(self.config.max_tokens_limit);
        let sizing = loaded.limit.size(ids.len(), asked).map_err(|e| {
            let mut e = ApiError::invalid(param, e.to_string());
            e.code = Some("context_length_exceeded");
            e
        })?;
        req.options.max_new_tokens = sizing.max_new_tokens;
        if let Some(kv) = &loaded.kv {
            crate::engine::kv_need(req.n, sizing.positions, kv)?;
        }
        // Every request passes through the queue, so a limit of 0 would refuse them all. A
        // request a free slot of the running set is about to take is not waiting: the
        // capacity is the running set's free slots plus --max-queue.
        let max_queue = self.config.max_queue.max(1);
        let free =
            (self.config.max_batch).saturating_sub(self.metrics.running.load(Ordering::Relaxed));
        if self.metrics.queued.fetch_add(1, Ordering::Relaxed) >= max_queue + free {
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(ApiError::queue_full(max_queue));
        }
        // Counted as queued before this last look, and fenced as `drain` is after it marks
        // the phase: a drain that began meanwhile is seen here, or it sees this request.
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Err(e) = self.ready() {
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(e);
        }
        let (events, receiver) = unbounded_channel();
        let arrived = Instant::now();
        let job = Job {
            positions: sizing.positions,
            ids,
            options: req.options,
            n: req.n,
            top_logprobs: req.top_logprobs,
            arrived,
            // A timeout too large to add to a time is no limit.
            deadline: self
                .config
                .request_timeout
                .and_then(|t| arrived.checked_add(t)),
            events,
        };
        if self.jobs.send(job).is_err() {
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(ApiError::unavailable(
                "engine_failed",
                "the engine has stopped",
            ));
        }
        Ok(Pending {
            kind,
            id: response_id(if kind == Kind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            }),
            created: unix_now(),
            model: req.model,
            n: req.n,
            stream: req.stream,
            include_usage: req.include_usage,
            logprobs: req.top_logprobs.is_some(),
            events: receiver,
            encoder: loaded.encoder.clone(),
            syntax,
        })
    }
}

async fn chat_completions(State(app): State<Arc<App>>, request: Request) -> Response {
    complete(app, request, Kind::Chat).await
}

async fn completions(State(app): State<Arc<App>>, request: Request) -> Response {
    complete(app, request, Kind::Completion).await
}

async fn complete(app: Arc<App>, request: Request, kind: Kind) -> Response {
    let pending = async {
        let loaded = app.ready()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let bounds = app.bounds(loaded);
        let req = match kind {
            Kind::Chat => api::chat(&body, &bounds)?,
            Kind::Completion => api::completion(&body, &bounds)?,
        };
        app.submit(kind, req).await
    };
    match pending.await {
        Err(e) => e.into_response(),
        Ok(p) if p.stream => stream(p).into_response(),
        Ok(p) => reply(collect(p).await),
    }
}

/// A JSON body, or the error in OpenAI's envelope.
fn reply(result: Result<Value, ApiError>) -> Response {
    match result {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// One choice being assembled.
#[derive(Default, Clone)]
struct Choice {
    /// The text, when the reply is not taken apart.
    text: String,
    /// The reply taken apart by `parser`.
    reply: Reply,
    parser: Option<ReplyParser>,
    finish: Option<&'static str>,
    /// (id, log-probabilities) per token.
    logprobs: Vec<(u32, Logprobs)>,
}

impl Choice {
    /// Takes a step's text through the parser, whose deltas go to `deltas`; without one the
    /// text is kept as it is (and `deltas` left empty).
    fn push(&mut self, text: &str, last: bool, deltas: &mut Vec<ReplyDelta>) {
        deltas.clear();
        let Some(parser) = &mut self.parser else {
            self.text.push_str(text);
            return;
        };
        parser.push(text, deltas);
        if last {
            parser.finish(deltas);
        }
        for d in deltas.iter() {
            self.reply.apply(d);
        }
    }

    /// OpenAI's finish reason: `tool_calls` when a reply that ended of itself made calls.
    fn finish_reason(&self, finish: oxgen::FinishReason) -> &'static str {
        let calls = self.parser.as_ref().is_some_and(|p| p.calls() > 0);
        match finish.as_str() {
            "stop" if calls => "tool_calls",
            other => other,
        }
    }

    /// The chat message of a whole reply.
    fn message(&self) -> Value {
        if self.parser.is_none() {
            return json!({"role": "assistant", "content": self.text});
        }
        let r = &self.reply;
        let content = if r.content.is_empty() && !r.calls.is_empty() {
            Value::Null
        } else {
            json!(r.content)
        };
        let mut m = json!({"role": "assistant", "content": content});
        if !r.reasoning.is_empty() {
            m["reasoning_content"] = json!(r.reasoning);
        }
        if !r.calls.is_empty() {
            m["tool_calls"] = (r.calls.iter())
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
        }
        m
    }
}

/// A streamed chat delta.
fn delta_json(d: &ReplyDelta) -> Value {
    match d {
        ReplyDelta::Content(t) => json!({"content": t}),
        ReplyDelta::Reasoning(t) => json!({"reasoning_content": t}),
        ReplyDelta::CallStart { index, id, name } => json!({"tool_calls": [{
            "index": index, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""},
        }]}),
        ReplyDelta::CallArguments { index, text } => json!({"tool_calls": [{
            "index": index, "function": {"arguments": text},
        }]}),
    }
}

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// The text of token `id` alone: U+FFFD where it holds part of a character.
fn token_text(encoder: &oxgen::Encoder, id: u32) -> String {
    encoder.decode(&[id], false).unwrap_or_default()
}

impl Pending {
    /// The `logprobs` object of a choice's `tokens`, in the endpoint's shape, and the
    /// `text_offset` after them: completions' offsets run over the token texts (whether the
    /// tokens arrive at once or chunk by chunk), from `text_start`.
    fn logprobs_json(&self, tokens: &[(u32, Logprobs)], text_start: usize) -> (Value, usize) {
        if !self.logprobs {
            return (Value::Null, text_start);
        }
        match self.kind {
            Kind::Chat => {
                let entry = |id: u32, logprob: f32| {
                    json!({
                        "token": token_text(&self.encoder, id),
                        "logprob": logprob,
                        "bytes": self.encoder.token_bytes(id),
                    })
                };
                let content: Vec<Value> = tokens
                    .iter()
                    .map(|(id, lp)| {
                        let mut e = entry(*id, lp.logprob);
                        e["top_logprobs"] = lp
                            .top
                            .iter()
                            .map(|&(t, l)| entry(t, l))
                            .collect::<Vec<_>>()
                            .into();
                        e
                    })
                    .collect();
                (json!({ "content": content }), text_start)
            }
            Kind::Completion => {
                let mut offset = text_start;
                let (mut texts, mut lps, mut tops, mut offsets) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for (id, lp) in tokens {
                    let token = token_text(&self.encoder, *id);
                    offsets.push(offset);
                    offset += token.len();
                    texts.push(token);
                    lps.push(lp.logprob);
                    // Keyed by text: ids that decode alike keep the likeliest one's value.
                    let mut top = serde_json::Map::new();
                    for &(t, l) in &lp.top {
                        top.entry(token_text(&self.encoder, t)).or_insert(json!(l));
                    }
                    tops.push(top);
                }
                let v = json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops,
                       "text_offset": offsets});
                (v, offset)
            }
        }
    }

    fn object(&self) -> &'static str {
        match (self.kind, self.stream) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": Value::Null,
            "choices": choices,
        })
    }

    /// A streaming chunk; with `include_usage` every chunk carries `"usage": null`.
    fn chunk(&self, choices: Vec<Value>) -> Value {
        let mut chunk = self.envelope(choices);
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// A choice of a response or a chunk: `body` as its message, delta or text.
    fn choice(&self, index: usize, body: Value, logprobs: Value, finish: Option<&str>) -> Value {
        let mut c = json!({"index": index, "logprobs": logprobs, "finish_reason": finish});
        let key = match (self.kind, self.stream) {
            (Kind::Chat, false) => "message",
            (Kind::Chat, true) => "delta",
            (Kind::Completion, _) => "text",
        };
        c[key] = body;
        c
    }

    /// The choices, each with its parser when the reply is taken apart.
    fn choices(&self) -> Vec<Choice> {
        let seed = oxgen::fresh_seed();
        (0..self.n)
            .map(|i| Choice {
                parser: (self.syntax)
                    .map(|s| ReplyParser::new(s, seed.wrapping_add(i as u64 * 0x9e37))),
                ..Choice::default()
            })
            .collect()
    }
}

/// Waits for the whole generation.
async fn collect(mut p: Pending) -> Result<Value, ApiError> {
    let mut choices = p.choices();
    let mut deltas = Vec::new();
    loop {
        match p.events.recv().await {
            Some(Event::Token { choice, step }) => {
                let c = &mut choices[choice];
                c.push(&step.text, step.finish.is_some(), &mut deltas);
                if let Some(lp) = step.logprobs {
                    c.logprobs.push((step.id, lp));
                }
                c.finish = step.finish.map(|f| c.finish_reason(f));
            }
            Some(Event::Done {
                prompt_tokens,
                completion_tokens,
            }) => {
                let choices = choices
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let (logprobs, _) = p.logprobs_json(&c.logprobs, 0);
                        let body = match p.kind {
                            Kind::Chat => c.message(),
                            Kind::Completion => json!(c.text),
                        };
                        p.choice(i, body, logprobs, c.finish)
                    })
                    .collect();
                let mut body = p.envelope(choices);
                body["usage"] = usage(prompt_tokens, completion_tokens);
                return Ok(body);
            }
            Some(Event::Error(e)) => return Err(e),
            None => {
                return Err(ApiError::unavailable(
                    "engine_failed",
                    "the engine stopped before the request finished",
                ));
            }
        }
    }
}

/// Server-sent events: a role chunk first (chat), content chunks (reasoning and tool-call
/// deltas too, when the reply is taken apart), a finish chunk per choice, the usage chunk
/// when asked, then `[DONE]`; an error becomes an error chunk followed by `[DONE]`.
/// Dropping the stream (the client left) drops the receiver, which cancels the request at
/// the engine's next turn.
fn stream(p: Pending) -> impl IntoResponse {
    let data = |v: Value| Sse::default().data(v.to_string());
    let mut first = Vec::new();
    if p.kind == Kind::Chat {
        let role = (0..p.n)
            .map(|i| {
                p.choice(
                    i,
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                    None,
                )
            })
            .collect();
        first.push(p.chunk(role));
    }
    let offsets = vec![0usize; p.n];
    let choices = p.choices();
    let head = futures_util::stream::iter(first.into_iter().map(data));
    let state = Some((p, offsets, choices, Vec::new()));
    let body = futures_util::stream::unfold(state, move |state| async move {
        let (mut p, mut offsets, mut choices, mut deltas) = state?;
        let out = match p.events.recv().await {
            Some(Event::Token { choice, step }) => {
                let mut out = Vec::new();
                let c = &mut choices[choice];
                if c.parser.is_some() {
                    c.push(&step.text, step.finish.is_some(), &mut deltas);
                } else if !step.text.is_empty() {
                    deltas.clear();
                    deltas.push(ReplyDelta::Content(step.text));
                } else {
                    deltas.clear();
                }
                let tokens: Vec<_> = step.logprobs.map(|lp| (step.id, lp)).into_iter().collect();
                let (mut logprobs, end) = p.logprobs_json(&tokens, offsets[choice]);
                offsets[choice] = end;
                if deltas.is_empty() && !logprobs.is_null() {
                    deltas.push(ReplyDelta::Content(String::new()));
                }
                for d in &deltas {
                    let body = match (p.kind, d) {
                        (Kind::Chat, d) => delta_json(d),
                        (Kind::Completion, ReplyDelta::Content(t)) => json!(t),
                        (Kind::Completion, _) => continue,
                    };
                    let lp = std::mem::take(&mut logprobs);
                    out.push(p.chunk(vec![p.choice(choice, body, lp, None)]));
                }
                if let Some(f) = step.finish {
                    let empty = match p.kind {
                        Kind::Chat => json!({}),
                        Kind::Completion => json!(""),
                    };
                    let reason = c.finish_reason(f);
                    out.push(p.chunk(vec![p.choice(choice, empty, Value::Null, Some(reason))]));
                }
                return Some((
                    out.into_iter().map(data).collect::<Vec<_>>(),
                    Some((p, offsets, choices, deltas)),
                ));
            }
            Some(Event::Done {
                prompt_tokens,
                completion_tokens,
            }) => {
                let mut out = Vec::new();
                if p.include_usage {
                    let mut chunk = p.envelope(Vec::new());
                    chunk["usage"] = usage(prompt_tokens, completion_tokens);
                    out.push(data(chunk));
                }
                out
            }
            Some(Event::Error(e)) => vec![data(e.body())],
            None => vec![data(
                ApiError::unavailable("engine_failed", "the engine stopped").body(),
            )],
        };
        let mut out = out;
        out.push(Sse::default().data("[DONE]"));
        Some((out, None))
    })
    .flat_map(futures_util::stream::iter);
    let events = head.chain(body).map(Ok::<_, Infallible>);
    axum::response::Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(1)))
}

async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_card(&app)]})).into_response()
}

async fn model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    if app.model_names().contains(&id) {
        axum::Json(model_card(&app)).into_response()
    } else {
        ApiError::model_not_found(&id, &app.model_names()).into_response()
    }
}

/// How the engine batches on this backend.
fn batching(app: &App) -> &'static str {
    match app.loaded.get().map(|l| l.capabilities.fused_decode) {
        Some(true) => {
            "continuous: each step runs every running sequence (decode tokens and prompt \
             chunks) in one forward over paged KV"
        }
        Some(false) => {
            "requests join and leave at token boundaries; each sequence runs its own forward \
             (this backend does not fuse a batch)"
        }
        None => "loading",
    }
}

fn model_card(app: &App) -> Value {
    json!({
        "id": app.config.model_id,
        "object": "model",
        "created": app.started,
        "owned_by": "oxgen",
        "aliases": app.config.aliases,
        "meta": {
            "backend": app.loaded.get().map(|l| l.backend),
            "threads": app.loaded.get().map(|l| l.threads),
            "context_length": app.loaded.get().map(|l| l.limit.max()),
            "max_batch": app.config.max_batch,
            "max_tokens_limit": app.config.max_tokens_limit,
            "batching": batching(app),
            "prefill_chunk": app.config.prefill_chunk,
            "fused_decode": app.loaded.get().map(|l| l.capabilities.fused_decode),
            "fused_prefill_with_past": app.loaded.get().map(|l| l.capabilities.fused_prefill_with_past),
            "kv_dtype": app.loaded.get().map(|l| l.kv_dtype.name()),
            "kv_cache": app.loaded.get().and_then(|l| l.kv.map(|kv| json!({
                "paged": true,
                "block_size": kv.block_size,
                "blocks": kv.total,
                "prefix_cache": l.prefix_cache,
            }))),
        },
    })
}

async fn health(State(app): State<Arc<App>>) -> Response {
    let live = json!({
        "queued": app.metrics.queued.load(Ordering::Relaxed),
        "running": app.metrics.running.load(Ordering::Relaxed),
        "kv_sequences": app.metrics.kv_sequences.load(Ordering::Relaxed),
    });
    let (status, state) = match app.phase() {
        Phase::Ready => (StatusCode::OK, "ok"),
        Phase::Loading => (StatusCode::SERVICE_UNAVAILABLE, "loading"),
        Phase::Draining => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
        Phase::Failed => (StatusCode::SERVICE_UNAVAILABLE, "failed"),
    };
    let mut body = json!({"status": state, "requests": live});
    if let Some(reason) = app.failure.get() {
        body["error"] = json!(reason);
    }
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

/// `POST /tokenize`: `{"prompt": "..."}` or `{"messages": [...]}` (rendered with the chat
/// template, with `tools` when given, as a chat request renders them) → `{"tokens": [...],
/// "count": n, "max_model_len": context}`.
async fn tokenize(State(app): State<Arc<App>>, request: Request) -> Response {
    let result = async {
        let loaded = app.ready()?;
        let map = api::object(&body(request, app.config.max_body, app.config.body_timeout).await?)?;
        api::known_fields(
            &map,
            &[&[
                "model",
                "prompt",
                "messages",
                "tools",
                "tool_choice",
                "chat_template_kwargs",
            ]],
        )?;
        check_model(&app, &map)?;
        let ids = match (map.get("prompt"), map.get("messages")) {
            (Some(Value::String(text)), None)
                if !map.contains_key("tools") && !map.contains_key("chat_template_kwargs") =>
            {
                encode(loaded, Prompt::Text(text.clone())).await?
            }
            (None, Some(_)) => {
                #[derive(serde::Deserialize)]
                struct Messages {
                    messages: Vec<Map<String, Value>>,
                }
                let value = Value::Object(map);
                let tools = api::tools(&value)?.map(|t| t.with_format(loaded.tool_format));
                let kwargs = api::template_kwargs(&value)?;
                let Messages { messages } = api::typed(&value)?;
                encode_chat(loaded, api::chat_messages(messages)?, tools, kwargs)
                    .await?
                    .0
            }
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "give either 'prompt' (a string) or 'messages' (with 'tools' if any)",
                ));
            }
        };
        Ok(json!({"tokens": ids, "count": ids.len(), "max_model_len": loaded.limit.max()}))
    };
    reply(result.await)
}

/// `POST /detokenize`: `{"tokens": [ids]}` → `{"prompt": "text"}`.
async fn detokenize(State(app): State<Arc<App>>, request: Request) -> Response {
    let result = async {
        let loaded = app.ready()?;
        let map = api::object(&body(request, app.config.max_body, app.config.body_timeout).await?)?;
        api::known_fields(&map, &[&["model", "tokens"]])?;
        check_model(&app, &map)?;
        #[derive(serde::Deserialize)]
        struct Tokens {
            tokens: Vec<u32>,
        }
        let value = Value::Object(map);
        let Tokens { tokens } = api::typed(&value)?;
        if let Some(bad) = tokens.iter().find(|&&id| id as usize >= loaded.vocab) {
            return Err(ApiError::invalid(
                "tokens",
                format!(
                    "token id {bad} is not below the vocabulary size {}",
                    loaded.vocab
                ),
            ));
        }
        let text = loaded
            .encoder
            .decode(&tokens, false)
            .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
        Ok(json!({ "prompt": text }))
    };
    reply(result.await)
}

/// An optional `model` must name the served model.
fn check_model(app: &App, map: &Map<String, Value>) -> Result<(), ApiError> {
    match map.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if app.model_names().contains(m) => Ok(()),
        Some(other) => {
            let asked = other.as_str().map_or(other.to_string(), str::to_string);
            Err(ApiError::model_not_found(&asked, &app.model_names()))
        }
    }
}
