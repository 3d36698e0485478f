//! Chat templates: the Jinja template a package ships, rendered with minijinja.
//!
//! Hugging Face templates are written for Python's jinja2 as `transformers` sets it up for
//! `apply_chat_template`: block tags trim the newline after them and the blanks before them
//! (`trim_blocks`, `lstrip_blocks`), `tojson` is Python's `json.dumps` (no HTML escaping, with
//! `indent`, `separators`, `sort_keys` and `ensure_ascii`), `raise_exception(msg)` and
//! `strftime_now(fmt)` are functions, loops may `break` and `continue`, and templates call
//! Python's string methods (`.strip()`, `.startswith()`), which minijinja-contrib's pycompat
//! layer supplies. The render context is transformers' too: `messages`, `tools`, `documents`,
//! `add_generation_prompt`, the special tokens and any extra arguments
//! (`chat_template_kwargs`: `enable_thinking`, `reasoning_effort`, `date_string`...).
//! `crates/server/src/api.rs` checks twelve families' templates against transformers' own
//! renderings, byte for byte. Templates run sandboxed: minijinja has no file or network
//! access, its recursion is bounded, and a render gets a fuel budget of instructions
//! ([`TEMPLATE_FUEL`]).

use std::path::Path;

use minijinja::value::{Kwargs, Value, ValueKind};
use serde::Serialize;
use serde_json::Map;

use crate::GenerateError;
use crate::tools::{ToolCall, ToolFormat, ToolSet, messages_without_tools};

/// One chat message. An assistant message may carry the tool calls it made and the
/// reasoning that preceded its answer; a `tool` message answers the call named by
/// `tool_call_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant's reasoning ([`ChatMessage::with_reasoning`]): templates read it as
    /// `reasoning_content` (Qwen3, SmolLM3) or `thinking` (gpt-oss), so it goes under both
    /// names, as transformers passes it.
    #[serde(rename = "reasoning_content", skip_serializing_if = "Option::is_none")]
    reasoning: Option<String>,
    #[serde(rename = "thinking", skip_serializing_if = "Option::is_none")]
    thinking: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning: None,
            thinking: None,
        }
    }

    /// The message with the reasoning that preceded it.
    pub fn with_reasoning(mut self, reasoning: &str) -> ChatMessage {
        self.reasoning = Some(reasoning.into());
        self.thinking = Some(reasoning.into());
        self
    }

    /// The reasoning that preceded the message, if any.
    pub fn reasoning(&self) -> Option<&str> {
        self.reasoning.as_deref()
    }
}

/// A compiled chat template with the special tokens it may refer to, and the extra
/// arguments every render gets unless a request gives its own.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    defaults: Map<String, serde_json::Value>,
    /// The template reads tools from the system message (Phi-4-mini's; Granite's, with the
    /// same call syntax, reads `tools`).
    tools_on_system: bool,
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
    /// The context names a render sets itself; extra arguments may not take them.
    pub const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

    /// Compiles `source`; `bos_token` / `eos_token` are exposed to it as variables.
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, GenerateError> {
        let mut env = minijinja::Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| GenerateError::Template(e.to_string()))?;
        env.set_syntax(syntax);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
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
            defaults: Map::new(),
            tools_on_system: source.contains(".tools") || source.contains("['tools']"),
        })
    }

    /// The template with extra arguments every render gets (`--chat-template-kwargs`); a
    /// render's own arguments take precedence, name by name.
    pub fn with_defaults(
        mut self,
        defaults: Map<String, serde_json::Value>,
    ) -> Result<ChatTemplate, GenerateError> {
        check_kwargs(&defaults)?;
        self.defaults = defaults;
        Ok(self)
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
        self.render_with(messages, tools, add_generation_prompt, &Map::new())
    }

    /// [`ChatTemplate::render_with_tools`] with extra arguments for the template
    /// (`chat_template_kwargs`: `enable_thinking`, `reasoning_effort`, `date_string`...), over
    /// the template's defaults; they may also set `bos_token` and `eos_token`.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&ToolSet>,
        add_generation_prompt: bool,
        kwargs: &Map<String, serde_json::Value>,
    ) -> Result<String, GenerateError> {
        check_kwargs(kwargs)?;
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
            && self.tools_on_system
        {
            let functions: Vec<serde_json::Value> = (set.tools.iter())
                .map(|t| t.to_json()["function"].clone())
                .collect();
            if list.first().is_none_or(|m| m["role"] != "system") {
                list.insert(0, serde_json::json!({"role": "system", "content": ""}));
            }
            list[0]["tools"] = serde_json::Value::Array(functions).to_string().into();
        }
        // As transformers: the special tokens, then the extra arguments, then what the
        // render itself sets (`tools` and `documents` are defined, as none, without them).
        let mut context = Map::new();
        context.insert("bos_token".into(), self.bos_token.clone().into());
        context.insert("eos_token".into(), self.eos_token.clone().into());
        for (k, v) in self.defaults.iter().chain(kwargs) {
            context.insert(k.clone(), v.clone());
        }
        context.insert("messages".into(), list);
        context.insert(
            "tools".into(),
            tools_json.map_or(serde_json::Value::Null, Into::into),
        );
        context.insert("documents".into(), serde_json::Value::Null);
        context.insert("add_generation_prompt".into(), add_generation_prompt.into());
        template
            .render(Value::from(minijinja::value::Serde(&context)))
            .map_err(|e| GenerateError::Template(format!("rendering: {e}")))
    }
}

/// Refuses extra arguments that would take a name the render sets.
fn check_kwargs(kwargs: &Map<String, serde_json::Value>) -> Result<(), GenerateError> {
    match (kwargs.keys()).find(|k| ChatTemplate::RESERVED.contains(&k.as_str())) {
        Some(k) => Err(GenerateError::Template(format!(
            "chat_template_kwargs may not set '{k}': the render sets {}",
            ChatTemplate::RESERVED.join(", ")
        ))),
        None => Ok(()),
    }
}

/// `tojson` as transformers defines it for templates: Python's `json.dumps(value,
/// ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, with those keywords.
/// Not HTML-escaped (minijinja's own filter is), and spaced as Python spaces it: `", "` and
/// `": "` on one line, `","` and `": "` when indented.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(usize::try_from(v.as_i64().unwrap_or(0).max(0)).unwrap_or(0)),
        }),
    };
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                "tojson: separators must be two strings, (item, key)",
            ));
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = PyJson {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(value, 0, &mut out)?;
    Ok(Value::from(out))
}

/// How `json.dumps` was asked to write.
struct PyJson {
    ensure_ascii: bool,
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
}

impl PyJson {
    fn write(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), minijinja::Error> {
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
            ValueKind::Number => out.push_str(&python_float(f64::try_from(v.clone())?)),
            ValueKind::String => self.string(v.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container(('[', ']'), depth, out, items.len(), |i, out| {
                    self.write(&items[i], depth + 1, out)
                })?;
            }
            ValueKind::Map => {
                let mut entries: Vec<(String, Value)> = Vec::new();
                for k in v.try_iter()? {
                    let item = v.get_item(&k)?;
                    let name = k.as_str().map_or_else(|| k.to_string(), str::to_string);
                    entries.push((name, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(('{', '}'), depth, out, entries.len(), |i, out| {
                    self.string(&entries[i].0, out);
                    out.push_str(&self.key);
                    self.write(&entries[i].1, depth + 1, out)
                })?;
            }
            kind => {
                return Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    format!("tojson: a value of kind {kind} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    /// `open`, the items separated (and indented, one per line, when asked), `close`.
    fn container(
        &self,
        (open, close): (char, char),
        depth: usize,
        out: &mut String,
        len: usize,
        mut item: impl FnMut(usize, &mut String) -> Result<(), minijinja::Error>,
    ) -> Result<(), minijinja::Error> {
        out.push(open);
        let newline = |out: &mut String, depth: usize| {
            if let Some(indent) = &self.indent {
                out.push('\n');
                (0..depth).for_each(|_| out.push_str(indent));
            }
        };
        for i in 0..len {
            if i > 0 {
                out.push_str(&self.item);
            }
            newline(out, depth + 1);
            item(i, out)?;
        }
        if len > 0 {
            newline(out, depth);
        }
        out.push(close);
        Ok(())
    }

    /// A JSON string as Python writes it: `\"`, `\\`, `\n`-style escapes and `\u00XX` for
    /// the other control characters; past ASCII as `\uXXXX` (surrogate pairs) only with
    /// `ensure_ascii`.
    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A float as Python's `repr` (which `json.dumps` uses) writes it: the shortest digits that
/// read back, positional from 1e-4 to below 1e16 (with `.0` when whole), else `1.5e-05`.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    if !(-4..16).contains(&exp) {
        let e = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{mantissa}e{e}{:02}", exp.abs());
    }
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let whole = exp as usize + 1;
    if digits.len() <= whole {
        format!("{sign}{digits}{}.0", "0".repeat(whole - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..whole], &digits[whole..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str) -> String {
        let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
        t.render(&[ChatMessage::new("user", "hi")], false).unwrap()
    }

    #[test]
    fn floats_read_as_python_writes_them() {
        // Each pair from CPython's repr.
        for (x, py) in [
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (1e16, "1e+16"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (100.0, "100.0"),
            (-0.0, "-0.0"),
            (2.5e-4, "0.00025"),
            (1e-4, "0.0001"),
            (1234567890123456.0, "1234567890123456.0"),
            (3e300, "3e+300"),
            (-1.5, "-1.5"),
        ] {
            assert_eq!(python_float(x), py, "{x:e}");
        }
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        // Expected texts from Python's json.dumps with the same arguments.
        let value =
            r#"{"b": [1, 2.5, {"x": none}], "a": "é\"\\\n\u0001<&>", "c": {}, "d": [], "t": true}"#;
        let set = format!("{{% set v = {value} %}}");
        assert_eq!(
            render(&format!("{set}{{{{ v | tojson }}}}")),
            r#"{"b": [1, 2.5, {"x": null}], "a": "é\"\\\n\u0001<&>", "c": {}, "d": [], "t": true}"#
        );
        assert_eq!(
            render(&format!("{set}{{{{ v | tojson(indent=2) }}}}")),
            "{\n  \"b\": [\n    1,\n    2.5,\n    {\n      \"x\": null\n    }\n  ],\n  \"a\": \"é\\\"\\\\\\n\\u0001<&>\",\n  \"c\": {},\n  \"d\": [],\n  \"t\": true\n}"
        );
        assert_eq!(
            render(&format!(
                "{set}{{{{ v | tojson(ensure_ascii=true, sort_keys=true, separators=[',', ':']) }}}}"
            )),
            r#"{"a":"\u00e9\"\\\n\u0001<&>","b":[1,2.5,{"x":null}],"c":{},"d":[],"t":true}"#
        );
    }

    #[test]
    fn block_tags_trim_as_transformers_sets_jinja2() {
        // trim_blocks drops the newline after a tag, lstrip_blocks the blanks before it.
        let source = "A\n    {% if true %}\nB\n    {% endif %}\nC";
        assert_eq!(render(source), "A\nB\nC");
        assert_eq!(
            render(
                "{% for i in [1, 2, 3] %}{% if i == 2 %}{% continue %}{% endif %}{{ i }}{% endfor %}"
            ),
            "13"
        );
    }

    #[test]
    fn extra_arguments_reach_the_template_but_not_its_own_names() {
        let t = ChatTemplate::new(
            "{{ enable_thinking }} {{ bos_token }} {{ messages | length }}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let messages = [ChatMessage::new("user", "hi")];
        let mut kwargs = Map::new();
        kwargs.insert("enable_thinking".into(), false.into());
        let t = t.with_defaults(kwargs.clone()).unwrap();
        assert_eq!(t.render(&messages, true).unwrap(), "False <s> 1");
        kwargs.insert("enable_thinking".into(), true.into());
        kwargs.insert("bos_token".into(), "<bos>".into());
        assert_eq!(
            t.render_with(&messages, None, true, &kwargs).unwrap(),
            "True <bos> 1"
        );
        kwargs.insert("messages".into(), serde_json::json!([]));
        let e = t.render_with(&messages, None, true, &kwargs).unwrap_err();
        assert!(e.to_string().contains("may not set 'messages'"), "{e}");
    }
}
