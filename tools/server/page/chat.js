// h2o-server's chat page: conversations from the server (GET /v1/conversations and their
// messages), replies streamed from /v1/chat/completions, a stop button that aborts the request
// (the server cancels the generation when its client leaves). Everything shown is set as text,
// never as markup: a model's output or a title cannot inject HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  id: null,        // the current conversation's id; null for a new one until its first message
  messages: [],    // its messages, as the protocol writes them
  controller: null // the streaming request's AbortController while a reply comes
};
const status = { model: "", bound: 0, rate: "", evicted: 0, note: "" };
let shown = 0; // counts the conversations asked to be shown: a slower answer for an earlier one is dropped

// A request to the server; its JSON body, or an Error carrying the server's message.
async function api(path, options) {
  const response = await fetch(path, options);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error((body.error && body.error.message) || `HTTP ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

function mib(bytes) { return (bytes / 1048576).toFixed(0) + " MiB"; }

function showStatus() {
  const parts = [];
  if (status.model) parts.push("model " + status.model);
  if (status.bound) parts.push("memory bound " + mib(status.bound));
  if (status.rate) parts.push(status.rate);
  if (status.evicted) parts.push(`cache full: ${status.evicted} older tokens evicted`);
  if (status.note) parts.push(status.note);
  $("status").textContent = parts.join(" · ");
}

function messageElement(role, text) {
  const div = document.createElement("div");
  div.className = "message " + role;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role;
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  div.append(label, body);
  return div;
}

function contentOf(message) {
  if (message.tool_calls) return message.tool_calls.map((c) => `${c.function.name}(${c.function.arguments})`).join("\n");
  return message.content || "";
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren(...state.messages.map((m) => messageElement(m.role, contentOf(m))));
  box.scrollTop = box.scrollHeight;
}

async function refreshList() {
  let list;
  try {
    list = await api("/v1/conversations");
  } catch (error) {
    status.note = "cannot list the conversations: " + error.message;
    return showStatus();
  }
  const items = list.data.map((c) => {
    const li = document.createElement("li");
    li.dataset.id = c.id;
    if (c.id === state.id) li.className = "current";
    const open = document.createElement("button");
    open.className = "open";
    open.type = "button";
    open.textContent = c.title || "(untitled)";
    open.title = `${c.turns} replies, ${c.tokens_held} tokens held`;
    open.addEventListener("click", () => openConversation(c.id));
    const remove = document.createElement("button");
    remove.className = "delete";
    remove.type = "button";
    remove.textContent = "×";
    remove.setAttribute("aria-label", "Delete conversation");
    remove.addEventListener("click", () => deleteConversation(c.id));
    li.append(open, remove);
    return li;
  });
  $("conversations").replaceChildren(...items);
}

async function openConversation(id) {
  if (state.controller) return;
  const mine = ++shown;
  let messages = [], note = "";
  try {
    messages = (await api(`/v1/conversations/${encodeURIComponent(id)}/messages`)).data;
  } catch (error) {
    note = error.message;
  }
  if (mine !== shown || state.controller) return;
  state.id = id;
  state.messages = messages;
  status.evicted = 0;
  status.note = note;
  localStorage.setItem("h2o-chat.current", id);
  renderMessages();
  showStatus();
  refreshList();
}

function newConversation() {
  if (state.controller) return;
  ++shown;
  state.id = null;
  state.messages = [];
  status.evicted = 0;
  status.note = "";
  localStorage.removeItem("h2o-chat.current");
  renderMessages();
  showStatus();
  refreshList();
  $("input").focus();
}

async function deleteConversation(id) {
  try {
    await api(`/v1/conversations/${encodeURIComponent(id)}`, { method: "DELETE" });
  } catch (error) {
    status.note = "cannot delete: " + error.message;
    showStatus();
  }
  if (id === state.id) newConversation();
  else refreshList();
}

// Reads server-sent events from a fetch response, giving each data payload to onData.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data: ")) onData(line.slice(6));
      }
    }
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").hidden = !busy;
}

async function send(text) {
  ++shown;
  if (!state.id && state.messages.length === 0 && $("system").value.trim())
    state.messages.push({ role: "system", content: $("system").value.trim() });
  state.messages.push({ role: "user", content: text });
  renderMessages();
  const reply = messageElement("assistant", "");
  $("messages").append(reply);
  const replyText = reply.querySelector(".text");
  // The page names its conversations from the first turn (the conversation_id extension): the
  // server then knows a client that comes back to them from one-shot requests.
  if (!state.id) {
    state.id = "p-" + Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, "0")).join("");
    localStorage.setItem("h2o-chat.current", state.id);
  }
  const body = { model: status.model || "default", messages: state.messages, stream: true, stream_options: { include_usage: true },
                 conversation_id: state.id };
  state.controller = new AbortController();
  setBusy(true);
  status.note = "";
  let first = 0, usage = null, failure = "";
  const calls = [];
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      signal: state.controller.signal
    });
    if (!response.ok) {
      const error = await response.json().catch(() => ({}));
      throw new Error((error.error && error.error.message) || `HTTP ${response.status}`);
    }
    await readEvents(response, (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) { failure = chunk.error.message; return; }
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        if (!first) first = performance.now();
        replyText.textContent += delta.content;
        $("messages").scrollTop = $("messages").scrollHeight;
      }
      if (delta && delta.tool_calls) calls.push(...delta.tool_calls);
    });
  } catch (error) {
    if (error.name === "AbortError") status.note = "stopped";
    else failure = error.message;
  }
  const assistant = calls.length ? { role: "assistant", content: null, tool_calls: calls } : { role: "assistant", content: replyText.textContent };
  if (calls.length) replyText.textContent = contentOf(assistant);
  if (failure) {
    // The message stays on the page with its error but leaves the history the next request sends,
    // so that the conversation goes on from what the server answered.
    state.messages.pop();
    reply.classList.add("error");
    replyText.textContent += (replyText.textContent ? "\n" : "") + failure;
  } else {
    state.messages.push(assistant);
  }
  if (usage) {
    const seconds = first ? (performance.now() - first) / 1000 : 0;
    status.rate = seconds > 0 ? `${(usage.completion_tokens / seconds).toFixed(0)} tokens/s` : `${usage.completion_tokens} tokens`;
    status.evicted = usage.evicted_tokens || 0;
  }
  state.controller = null;
  setBusy(false);
  showStatus();
  refreshList();
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("input").value.trim();
  if (!text || state.controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => { if (state.controller) state.controller.abort(); });
$("new").addEventListener("click", newConversation);

(async function start() {
  try {
    const health = await api("/health");
    status.model = health.model;
    status.bound = health.memory && health.memory.bound_bytes;
  } catch (error) {
    status.note = "the server does not answer: " + error.message;
  }
  showStatus();
  await refreshList();
  const last = localStorage.getItem("h2o-chat.current");
  if (last && document.querySelector(`#conversations li[data-id="${CSS.escape(last)}"]`)) await openConversation(last);
})();
