// oxgen's chat page: talks to this server's own OpenAI endpoints, keeps conversations in
// the browser's local storage, and never puts model text into the page as HTML (every piece
// of it is a text node).
"use strict";

const $ = (id) => document.getElementById(id);
const CHATS = "oxgen.chats";
const SETTINGS = "oxgen.settings";
const FIELDS = ["system", "temperature", "top_p", "max_tokens", "seed", "json-mode", "schema", "tools", "api-key"];

let chats = [];
let current = null;
let model = null;
let controller = null;
let editing = null;

function loadState() {
  try {
    chats = JSON.parse(localStorage.getItem(CHATS)) || [];
  } catch {
    chats = [];
  }
  current = chats.length ? chats[0].id : null;
  let settings = {};
  try {
    settings = JSON.parse(localStorage.getItem(SETTINGS)) || {};
  } catch {
    settings = {};
  }
  for (const f of FIELDS) {
    if (settings[f] !== undefined) $(f).value = settings[f];
  }
  $("schema-label").hidden = $("json-mode").value !== "json_schema";
}

function saveChats() {
  localStorage.setItem(CHATS, JSON.stringify(chats));
}

function saveSettings() {
  const settings = {};
  for (const f of FIELDS) settings[f] = $(f).value;
  localStorage.setItem(SETTINGS, JSON.stringify(settings));
  $("schema-label").hidden = $("json-mode").value !== "json_schema";
}

function chat() {
  let c = chats.find((c) => c.id === current);
  if (!c) {
    c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2), title: "New chat", messages: [] };
    chats.unshift(c);
    current = c.id;
  }
  return c;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

// Markdown as DOM nodes: fenced code blocks, headings, lists, paragraphs; inline code,
// bold and italics. Text only ever goes into text nodes.
function markdown(text) {
  const out = document.createDocumentFragment();
  const lines = text.split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*```(\S*)/);
    if (fence) {
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      if (fence[1]) code.dataset.lang = fence[1];
      const body = [];
      i++;
      while (i < lines.length && !/^\s*```/.test(lines[i])) body.push(lines[i++]);
      i++;
      code.textContent = body.join("\n");
      pre.append(code);
      out.append(pre);
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)/);
    if (heading) {
      const h = document.createElement("h" + Math.min(heading[1].length + 2, 6));
      inline(h, heading[2]);
      out.append(h);
      i++;
      continue;
    }
    if (/^\s*([-*]|\d+\.)\s+/.test(line)) {
      const ordered = /^\s*\d+\./.test(line);
      const list = document.createElement(ordered ? "ol" : "ul");
      while (i < lines.length && /^\s*([-*]|\d+\.)\s+/.test(lines[i])) {
        const li = document.createElement("li");
        inline(li, lines[i].replace(/^\s*([-*]|\d+\.)\s+/, ""));
        list.append(li);
        i++;
      }
      out.append(list);
      continue;
    }
    if (!line.trim()) {
      i++;
      continue;
    }
    const p = document.createElement("p");
    const para = [];
    while (i < lines.length && lines[i].trim() && !/^\s*(```|#{1,6}\s|[-*]\s|\d+\.\s)/.test(lines[i])) {
      para.push(lines[i++]);
    }
    if (!para.length) para.push(lines[i++]);
    inline(p, para.join("\n"));
    p.style.whiteSpace = "pre-wrap";
    out.append(p);
  }
  return out;
}

function inline(parent, text) {
  const parts = text.split(/(`[^`\n]+`|\*\*[^*\n]+\*\*|\*[^*\n]+\*)/);
  for (const part of parts) {
    if (!part) continue;
    let node;
    if (/^`[^`]+`$/.test(part)) {
      node = document.createElement("code");
      node.textContent = part.slice(1, -1);
    } else if (/^\*\*[^*]+\*\*$/.test(part)) {
      node = document.createElement("strong");
      node.textContent = part.slice(2, -2);
    } else if (/^\*[^*]+\*$/.test(part)) {
      node = document.createElement("em");
      node.textContent = part.slice(1, -1);
    } else {
      node = document.createTextNode(part);
    }
    parent.append(node);
  }
}

function button(label, onclick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", onclick);
  return b;
}

function messageElement(m, index, last) {
  const div = document.createElement("div");
  div.className = "message " + m.role;
  div.dataset.index = index;
  if (m.role === "user") {
    div.textContent = m.content;
    const actions = document.createElement("div");
    actions.className = "actions";
    actions.append(button("Edit", () => edit(index)));
    div.append(actions);
    return div;
  }
  if (m.reasoning) {
    const details = document.createElement("details");
    details.className = "reasoning";
    const summary = document.createElement("summary");
    summary.textContent = "Reasoning";
    details.append(summary, document.createTextNode(m.reasoning));
    div.append(details);
  }
  const content = document.createElement("div");
  content.className = "content";
  content.append(markdown(m.content || ""));
  div.append(content);
  for (const call of m.calls || []) {
    const c = document.createElement("div");
    c.className = "call";
    c.textContent = `call ${call.function.name}(${call.function.arguments})`;
    div.append(c);
  }
  const notes = [];
  if (m.stats) {
    const s = m.stats;
    notes.push(`${s.tokens} tokens`);
    if (s.ttft != null) notes.push(`first token ${s.ttft} ms`);
    if (s.rate != null) notes.push(`${s.rate} tok/s`);
    notes.push(`${s.cached} prompt tokens reused`);
  }
  if (m.stopped) notes.push("stopped");
  if (m.error) notes.push("error: " + m.error);
  if (notes.length) {
    const stats = document.createElement("div");
    stats.className = "stats";
    stats.textContent = notes.join(" · ");
    div.append(stats);
  }
  if (last && !controller) {
    const actions = document.createElement("div");
    actions.className = "actions";
    actions.append(button("Regenerate", regenerate));
    div.append(actions);
  }
  return div;
}

function render() {
  const list = $("chats");
  list.replaceChildren();
  for (const c of chats) {
    const li = document.createElement("li");
    li.textContent = c.title;
    if (c.id === current) li.className = "current";
    li.addEventListener("click", () => {
      if (controller) return;
      current = c.id;
      render();
    });
    list.append(li);
  }
  const c = chats.find((c) => c.id === current);
  const messages = c ? c.messages : [];
  $("messages").replaceChildren(...messages.map((m, i) => messageElement(m, i, i === messages.length - 1)));
  $("messages").scrollTop = $("messages").scrollHeight;
  $("send").hidden = !!controller;
  $("stop").hidden = !controller;
}

function updateLast(m) {
  const box = $("messages");
  const old = box.lastElementChild;
  const index = chat().messages.length - 1;
  const fresh = messageElement(m, index, true);
  if (old && old.dataset.index === String(index)) old.replaceWith(fresh);
  else box.append(fresh);
  box.scrollTop = box.scrollHeight;
}

function requestBody(c) {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of c.messages) {
    if (m.role === "user") messages.push({ role: "user", content: m.content });
    else if (!m.error) {
      const a = { role: "assistant", content: m.content || "" };
      if (m.calls && m.calls.length) a.tool_calls = m.calls;
      messages.push(a);
    }
  }
  const body = {
    model: model ? model.id : "",
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    top_p: Number($("top_p").value),
    max_tokens: Number($("max_tokens").value),
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  const mode = $("json-mode").value;
  if (mode === "json_object") body.response_format = { type: "json_object" };
  if (mode === "json_schema") {
    body.response_format = { type: "json_schema", json_schema: { name: "schema", schema: JSON.parse($("schema").value || "{}") } };
  }
  if ($("tools").value.trim()) body.tools = JSON.parse($("tools").value);
  return body;
}

function failure(status, body) {
  const detail = body && body.error && body.error.message ? body.error.message : "";
  if (status === 401) return "the server needs an API key: enter it in Settings (" + detail + ")";
  if (status === 429) return "the server is busy (429): " + detail;
  return `the server answered ${status}: ${detail}`;
}

async function generate() {
  const c = chat();
  let body;
  try {
    body = requestBody(c);
  } catch (e) {
    showError("a setting is not valid JSON: " + e.message);
    return;
  }
  const m = { role: "assistant", content: "", reasoning: "", calls: [] };
  c.messages.push(m);
  controller = new AbortController();
  showError("");
  render();
  const started = performance.now();
  let first = null;
  let usage = null;
  let chunks = 0;
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!res.ok) throw new Error(failure(res.status, await res.json().catch(() => null)));
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.usage) usage = chunk.usage;
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          if (!delta) continue;
          if (delta.content || delta.reasoning_content || delta.tool_calls) {
            chunks++;
            if (first == null) first = performance.now();
          }
          if (delta.content) m.content += delta.content;
          if (delta.reasoning_content) m.reasoning += delta.reasoning_content;
          for (const t of delta.tool_calls || []) {
            if (!m.calls[t.index]) m.calls[t.index] = { id: t.id, type: "function", function: { name: t.function.name, arguments: "" } };
            m.calls[t.index].function.arguments += t.function.arguments || "";
          }
          updateLast(m);
        }
      }
    }
  } catch (e) {
    if (e.name === "AbortError") m.stopped = true;
    else {
      m.error = e instanceof TypeError ? "could not reach the server (" + e.message + ")" : e.message;
      showError(m.error);
    }
  }
  const ended = performance.now();
  const tokens = usage ? usage.completion_tokens : chunks;
  m.stats = {
    tokens,
    ttft: first == null ? null : Math.round(first - started),
    rate: first == null || ended <= first || tokens < 2 ? null : ((tokens - 1) / ((ended - first) / 1000)).toFixed(1),
    cached: usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0,
  };
  if (c.title === "New chat" && c.messages.length) c.title = c.messages[0].content.slice(0, 40) || "New chat";
  controller = null;
  saveChats();
  render();
  refreshKv();
}

function send() {
  const text = $("input").value;
  if (!text.trim() || controller) return;
  const c = chat();
  if (editing != null) {
    c.messages = c.messages.slice(0, editing);
    editing = null;
  }
  c.messages.push({ role: "user", content: text });
  $("input").value = "";
  generate();
}

function edit(index) {
  if (controller) return;
  editing = index;
  $("input").value = chat().messages[index].content;
  $("input").focus();
}

function regenerate() {
  const c = chat();
  if (controller || !c.messages.length) return;
  if (c.messages[c.messages.length - 1].role === "assistant") c.messages.pop();
  generate();
}

async function refreshModel() {
  try {
    const res = await fetch("/v1/models", { headers: headers() });
    if (!res.ok) {
      showError(failure(res.status, await res.json().catch(() => null)));
      return;
    }
    const data = await res.json();
    // Several models: a picker over those that generate (encoders are for the API).
    const models = data.data.filter((m) => !["embedding", "rerank"].includes((m.meta || {}).kind));
    const pick = $("model-pick");
    const wanted = pick.value || localStorage.getItem("oxgen.model");
    model = models.find((m) => m.id === wanted) || models[0] || data.data[0];
    pick.hidden = models.length < 2;
    pick.replaceChildren(...models.map((m) => {
      const option = document.createElement("option");
      option.value = option.textContent = m.id;
      return option;
    }));
    pick.value = model.id;
    const meta = model.meta || {};
    $("model-info").textContent = `${model.id} · ${meta.backend || "?"} · context ${meta.context_length || "?"}`;
    showError("");
  } catch (e) {
    showError("could not reach the server (" + e.message + ")");
  }
}

async function refreshKv() {
  try {
    const res = await fetch("/metrics", { headers: headers() });
    if (!res.ok) return;
    const text = await res.text();
    const value = (state) => {
      const m = text.match(new RegExp(`^oxgen_kv_blocks\\{state="${state}"\\} (\\S+)`, "m"));
      return m ? Number(m[1]) : null;
    };
    const used = value("used");
    const total = value("total");
    if (used != null && total) $("kv-info").textContent = `KV ${used}/${total} blocks`;
  } catch {
    // The model line says when the server cannot be reached.
  }
}

function init() {
  loadState();
  for (const f of FIELDS) $(f).addEventListener("change", saveSettings);
  $("api-key").addEventListener("change", refreshModel);
  $("model-pick").addEventListener("change", () => {
    localStorage.setItem("oxgen.model", $("model-pick").value);
    refreshModel();
  });
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("new-chat").addEventListener("click", () => {
    if (controller) return;
    current = null;
    chat();
    saveChats();
    render();
  });
  $("toggle-side").addEventListener("click", () => $("side").classList.toggle("open"));
  render();
  refreshModel();
  refreshKv();
  setInterval(refreshKv, 3000);
}

init();
