//! A request made ready to generate, the same way for every front end: its prompts rendered
//! (a chat's with its tools and reasoning effort, through the package's template) and
//! tokenized, the reply's syntax found (tool-call format, reasoning block), the constraint
//! composed (tool calls, the answer's schema, reasoning first) and compiled, a reasoning
//! budget's closing ids and a prediction's ids encoded. [`prepare`] does it all, off any
//! model lock: it needs the encoder and the grammar compiler only.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::{
    ChatMessage, Constraint, Encoder, Error, GenerateError, GenerateOptions, Grammar, Grammars,
    Prompt, ReasoningBudget, ReplySyntax, Tool, ToolChoice, ToolFormat, ToolSet, after_reasoning,
    tool_grammar,
};

/// What to prepare.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompts: Vec<Prompt>,
    /// The request field that holds the prompts (`messages`, `prompt`), named in errors.
    pub param: String,
    pub tools: Option<ToolSet>,
    /// The answer's constraint, with the request field that gave it.
    pub constraint: Option<(String, Constraint)>,
    /// Extra chat template arguments.
    pub template_kwargs: Map<String, Value>,
    /// OpenAI's `reasoning_effort` ([`reasoning_kwargs`]).
    pub reasoning_effort: Option<String>,
    pub add_generation_prompt: bool,
    /// vLLM's `continue_final_message` ([`continue_final`]).
    pub continue_final_message: bool,
    /// Tokens the reasoning may take before its closing is forced.
    pub reasoning_budget: Option<usize>,
    /// Close a constrained reply within its token limit ([`Grammar::closing`]).
    pub close_structured_output: bool,
    /// Text the reply is expected to repeat (speculative proposals).
    pub prediction: Option<String>,
    /// Keep each text prompt's text (to echo it); a chat's rendered text is always kept.
    pub keep_text: bool,
}

impl Request {
    /// A request for `prompts` with nothing else: a generation prompt added, replies closed
    /// within their limit.
    pub fn new(prompts: Vec<Prompt>, param: &str) -> Request {
        Request {
            prompts,
            param: param.into(),
            tools: None,
            constraint: None,
            template_kwargs: Map::new(),
            reasoning_effort: None,
            add_generation_prompt: true,
            continue_final_message: false,
            reasoning_budget: None,
            close_structured_output: true,
            prediction: None,
            keep_text: false,
        }
    }
}

/// A prepared request.
#[derive(Debug, Default)]
pub struct Prepared {
    /// Each prompt's ids and text (the text empty where it was not kept).
    pub prompts: Vec<(Vec<u32>, String)>,
    /// How a chat reply is taken apart (tool calls, reasoning); `None` for plain text.
    pub syntax: Option<ReplySyntax>,
    pub constraint: Option<Grammar>,
    /// The constraint cannot be closed early (its reply may be cut by the token limit).
    pub unclosable: bool,
    pub reasoning_budget: Option<ReasoningBudget>,
    pub prediction: Vec<u32>,
    /// Special tokens stay in the text: the reply parser reads markers made of them.
    pub keep_special: bool,
}

impl Prepared {
    /// Sets what it prepared on `options` (the constraint, the reasoning budget, the
    /// prediction, whether special tokens stay in the text).
    pub fn apply(&mut self, options: &mut GenerateOptions) {
        if let Some(grammar) = self.constraint.take() {
            options.constraint = Some(grammar);
        }
        if let Some(budget) = self.reasoning_budget.take() {
            options.reasoning_budget = Some(budget);
        }
        if !self.prediction.is_empty() {
            options.prediction = std::mem::take(&mut self.prediction);
        }
        options.keep_special |= self.keep_special;
    }
}

/// Why a request could not be prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrepareError {
    /// The chat template refused the messages (well-formed, but this model cannot take
    /// them).
    Template(String),
    /// A field is wrong: its name (empty when it is the prompt as a whole) and why.
    Invalid { param: String, message: String },
}

impl std::fmt::Display for PrepareError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrepareError::Template(m) => write!(f, "the chat template refused the messages: {m}"),
            PrepareError::Invalid { param, message } if param.is_empty() => f.write_str(message),
            PrepareError::Invalid { param, message } => write!(f, "{param}: {message}"),
        }
    }
}

impl std::error::Error for PrepareError {}

fn invalid(param: impl Into<String>, message: impl ToString) -> PrepareError {
    PrepareError::Invalid {
        param: param.into(),
        message: message.to_string(),
    }
}

/// A chat template's refusal, or anything else wrong with the prompt.
fn prompt_error(e: Error) -> PrepareError {
    match e {
        Error::Generate(GenerateError::Template(m)) => PrepareError::Template(m),
        other => invalid("", other),
    }
}

/// Prepares `request` (see the module doc) with `encoder` and the grammar compiler
/// (`Err`: why there is none, reported for a request that needs one).
pub fn prepare(
    encoder: &Encoder,
    grammars: Result<&Arc<Grammars>, &str>,
    mut request: Request,
) -> Result<Prepared, PrepareError> {
    let mut prepared = render(encoder, &mut request)?;
    let tools = request.tools.take();
    let syntax = prepared.syntax;
    // With reasoning first, only the answer is constrained.
    let tokenizer = encoder.tokenizer();
    let reasoned = |c| match &syntax {
        Some(s) => after_reasoning(c, s, tokenizer),
        None => c,
    };
    let answer = request.constraint.take();
    let calls = (tools.as_ref())
        .and_then(|set| tool_grammar(set, answer.as_ref().map(|(_, c)| c), tokenizer));
    let grammar = match calls {
        // gpt-oss's tool grammar allows the analysis message itself.
        Some(c) if syntax.is_some_and(|s| s.harmony) => Some(("tools".to_string(), c)),
        Some(c) => Some(("tools".to_string(), reasoned(c))),
        None => answer.map(|(param, c)| (param, reasoned(c))),
    };
    if let Some((param, c)) = grammar {
        let grammar = compile(grammars, param, &c, tools.as_ref())?;
        let close = request.close_structured_output;
        prepared.unclosable = close && !grammar.closable();
        prepared.constraint = Some(grammar.closing(close));
    }
    let encode = |text: &str| {
        encoder
            .encode(&Prompt::Text(text.into()))
            .map_err(prompt_error)
    };
    if let Some(text) = &request.prediction {
        prepared.prediction = encode(text)?;
    }
    if let (Some(tokens), Some(s)) = (request.reasoning_budget, syntax) {
        let (open, close) = reasoning_markers(s);
        prepared.reasoning_budget = Some(ReasoningBudget {
            tokens,
            open: open.into(),
            close: close.into(),
            close_ids: encode(close)?,
            inside: s.think_open,
        });
    }
    prepared.keep_special =
        syntax.is_some_and(|s| s.harmony || s.tools.is_some_and(|f| f.keeps_special()));
    Ok(prepared)
}

/// `request`'s prompts rendered (a chat's with its tools) and tokenized, and how a chat
/// reply is taken apart: [`prepare`] without the constraint, the budget and the prediction.
/// The prompts are taken out of `request` (a token prompt's ids move, uncopied).
pub fn render(encoder: &Encoder, request: &mut Request) -> Result<Prepared, PrepareError> {
    let mut prepared = Prepared::default();
    let prompts = std::mem::take(&mut request.prompts);
    let request = &*request;
    let tools = request.tools.as_ref();
    for prompt in prompts {
        let param = &request.param;
        let (ids, text) = match prompt {
            Prompt::Chat(messages) => {
                let (ids, text) = render_chat(encoder, &messages, tools, request)?;
                let template = encoder.template().map_or("", |t| t.source());
                let calls = tools
                    .filter(|t| t.choice != ToolChoice::None)
                    .map(|t| t.format);
                let s = ReplySyntax::of_template(template, &text, calls);
                prepared.syntax = (!s.is_plain()).then_some(s);
                (ids, text)
            }
            Prompt::Text(text) => {
                let ids = (encoder.tokenizer().encode(&text, false))
                    .map_err(|e| prompt_error(e.into()))?;
                let text = if request.keep_text {
                    text
                } else {
                    String::new()
                };
                (ids, text)
            }
            Prompt::Tokens(ids) if request.keep_text => {
                let text = (encoder.decode(&ids, false)).map_err(|e| invalid(param, e))?;
                (ids, text)
            }
            Prompt::Tokens(ids) => (ids, String::new()),
        };
        prepared.prompts.push((ids, text));
    }
    Ok(prepared)
}

/// A conversation rendered with its tools as `request` says, and its ids.
fn render_chat(
    encoder: &Encoder,
    messages: &[ChatMessage],
    tools: Option<&ToolSet>,
    request: &Request,
) -> Result<(Vec<u32>, String), PrepareError> {
    let mut kwargs = request.template_kwargs.clone();
    if let Some(effort) = &request.reasoning_effort {
        let template = encoder.template().map_or("", |t| t.source());
        reasoning_kwargs(effort, template, &mut kwargs);
    }
    let generation = request.add_generation_prompt;
    let mut text =
        (encoder.render_with(messages, tools, &kwargs, generation)).map_err(prompt_error)?;
    if request.continue_final_message {
        text = continue_final(text, messages)?;
    }
    let ids = encoder.encode(&Prompt::Text(text.clone()));
    Ok((ids.map_err(prompt_error)?, text))
}

/// Where a reply's reasoning opens and closes: `<think>` and `</think>`, or gpt-oss's
/// analysis channel and the turn to its final one.
fn reasoning_markers(syntax: ReplySyntax) -> (&'static str, &'static str) {
    if syntax.harmony {
        (
            "<|channel|>analysis<|message|>",
            "<|end|><|start|>assistant<|channel|>final<|message|>",
        )
    } else {
        ("<think>", "</think>")
    }
}

/// Compiles a request's constraint; one that does not compile names the field that gave
/// it: for a tool grammar, the first tool whose parameters do not compile alone.
fn compile(
    grammars: Result<&Arc<Grammars>, &str>,
    param: String,
    c: &Constraint,
    tools: Option<&ToolSet>,
) -> Result<Grammar, PrepareError> {
    let grammars = grammars.map_err(|e| invalid(&param, e))?;
    grammars.compile(c).map_err(|e| {
        let culprit =
            (tools.iter().flat_map(|set| set.tools.iter().enumerate())).find_map(|(i, t)| {
                let alone = Constraint::JsonSchema(t.parameters.clone());
                let e = grammars.compile(&alone).err()?;
                Some(invalid(format!("tools[{i}].function.parameters"), e))
            });
        culprit.unwrap_or_else(|| invalid(param, e))
    })
}

/// A chat request's `tools`, `tool_choice` and `parallel_tool_calls`.
#[derive(Debug, Clone)]
pub struct Tools {
    pub tools: Vec<Tool>,
    /// Each tool's `strict`.
    pub strict: Vec<bool>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl Tools {
    /// Closes the objects of the parameters of every tool for which `close` says so (given
    /// its `strict`).
    pub fn close_objects(&mut self, close: impl Fn(bool) -> bool) {
        for (tool, &strict) in self.tools.iter_mut().zip(&self.strict) {
            if close(strict) {
                tool.parameters = crate::close_objects(&tool.parameters);
            }
        }
    }

    /// The set the model gets, in the model's call format.
    pub fn with_format(self, format: ToolFormat) -> ToolSet {
        ToolSet {
            tools: self.tools,
            choice: self.choice,
            parallel: self.parallel,
            format,
        }
    }
}

/// A function name as OpenAI allows it: 1-64 of `a-z A-Z 0-9 _ -`.
fn function_name(param: &str, v: Option<&Value>) -> Result<String, PrepareError> {
    let name = string(param, v.unwrap_or(&Value::Null))?;
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(name)
    } else {
        Err(invalid(
            param,
            format!("{param} must be 1 to 64 of a-z, A-Z, 0-9, _ and -, got {name:?}"),
        ))
    }
}

/// `tools`, `tool_choice` and `parallel_tool_calls`. Without tools, `tool_choice` may only
/// be `none`.
pub fn tools(body: &Value) -> Result<Option<Tools>, PrepareError> {
    let list = match body.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.clone(),
        Some(_) => return Err(invalid("tools", "tools must be an array")),
    };
    let mut tools: Vec<Tool> = Vec::with_capacity(list.len());
    let mut strict = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(invalid(
                format!("{at}.type"),
                "only tools of type 'function' are supported",
            ));
        }
        let Some(function) = t.get("function").and_then(Value::as_object) else {
            return Err(invalid(
                format!("{at}.function"),
                "a tool needs function: {name, description, parameters}",
            ));
        };
        let name = function_name(&format!("{at}.function.name"), function.get("name"))?;
        if tools.iter().any(|t| t.name == name) {
            return Err(invalid(
                format!("{at}.function.name"),
                format!("two tools are named '{name}'"),
            ));
        }
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(invalid(
                    format!("{at}.function.parameters"),
                    "parameters must be a JSON schema object",
                ));
            }
        };
        let description = match function.get("description") {
            None | Some(Value::Null) => None,
            Some(d) => Some(string(&format!("{at}.function.description"), d)?),
        };
        strict.push(boolean(
            &format!("{at}.function.strict"),
            function.get("strict"),
            false,
        )?);
        tools.push(Tool {
            name,
            description,
            parameters,
        });
    }
    let choice = match body.get("tool_choice") {
        None | Some(Value::Null) if tools.is_empty() => ToolChoice::None,
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(invalid(
                    "tool_choice",
                    format!(
                        "tool_choice '{other}' is not one of none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                    ),
                ));
            }
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"));
            let name = function_name("tool_choice.function.name", name)?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(invalid(
                    "tool_choice",
                    format!("tool_choice names '{name}', which is not among the tools"),
                ));
            }
            ToolChoice::Function(name)
        }
    };
    if tools.is_empty() && choice != ToolChoice::None {
        return Err(invalid(
            "tool_choice",
            "tool_choice needs tools to choose from",
        ));
    }
    let parallel = boolean("parallel_tool_calls", body.get("parallel_tool_calls"), true)?;
    Ok((!tools.is_empty()).then_some(Tools {
        tools,
        strict,
        choice,
        parallel,
    }))
}

fn string(param: &str, v: &Value) -> Result<String, PrepareError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| invalid(param, format!("{param} must be a string")))
}

fn boolean(param: &str, v: Option<&Value>, default: bool) -> Result<bool, PrepareError> {
    match v {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid(param, format!("{param} must be a boolean"))),
    }
}

/// The efforts `reasoning_effort` takes (OpenAI's).
pub const REASONING_EFFORTS: [&str; 5] = ["none", "minimal", "low", "medium", "high"];

/// What a reasoning effort means to the chat template `template`, added to `kwargs` unless
/// they already set it: a template that reads `reasoning_effort` (gpt-oss: low, medium or
/// high) gets it, "none" and "minimal" as its lowest, "low"; one with an `enable_thinking`
/// switch (Qwen3, SmolLM3) gets thinking off for "none" and "minimal", on otherwise.
pub fn reasoning_kwargs(effort: &str, template: &str, kwargs: &mut Map<String, Value>) {
    let off = matches!(effort, "none" | "minimal");
    if template.contains("reasoning_effort") {
        let effort = if off { "low" } else { effort };
        (kwargs.entry("reasoning_effort")).or_insert_with(|| Value::from(effort));
    }
    if template.contains("enable_thinking") {
        kwargs.entry("enable_thinking").or_insert(Value::Bool(!off));
    }
}

/// vLLM's `continue_final_message`: `text` (rendered without a generation prompt) cut right
/// after the last message's content, so the reply continues it.
pub fn continue_final(text: String, messages: &[ChatMessage]) -> Result<String, PrepareError> {
    let last = messages.last().map_or("", |m| m.content.as_str());
    match text.rfind(last).filter(|_| !last.is_empty()) {
        Some(at) => Ok(text[..at + last.len()].to_string()),
        None => Err(invalid(
            "continue_final_message",
            "continue_final_message: the chat template does not render the last message's \
             content as it is (or it is empty), so there is nothing to continue",
        )),
    }
}
