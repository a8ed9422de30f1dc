// The chat page: a conversation streamed from /v1/chat/completions, with the sampling controls.
"use strict";

const $ = (id) => document.getElementById(id);
const history = [];
let controller = null;

const NUMBERS = ["temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                 "presence_penalty", "frequency_penalty", "seed", "max_tokens"];

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api_key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function bubble(kind, text) {
  const div = document.createElement("div");
  div.className = "message " + kind;
  div.textContent = text;
  $("messages").appendChild(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return div;
}

function describe(t) {
  const parts = [];
  if (t.prompt_n !== undefined) parts.push(`prompt ${t.prompt_n} tok` + (t.prompt_per_second ? ` at ${t.prompt_per_second.toFixed(0)} tok/s` : ""));
  if (t.cache_n) parts.push(`${t.cache_n} reused`);
  parts.push(`${t.predicted_n} tok` + (t.predicted_per_second ? ` at ${t.predicted_per_second.toFixed(1)} tok/s` : ""));
  parts.push(`first token ${t.ttft_ms.toFixed(0)} ms`);
  return parts.join(" · ");
}

function body() {
  // a thinking model's thought arrives apart (reasoning_content) and stays out of the history
  const b = { messages: [], stream: true, stream_options: { include_usage: true },
              reasoning_format: "auto" };
  const system = $("system").value.trim();
  if (system) b.messages.push({ role: "system", content: system });
  b.messages.push(...history);
  for (const name of NUMBERS) {
    const raw = $(name).value.trim();
    if (raw !== "") b[name] = Number(raw);
  }
  const format = $("format").value;
  if (format === "json_object") b.response_format = { type: "json_object" };
  if (format === "json_schema") {
    let schema;
    try {
      schema = JSON.parse($("schema").value);
    } catch (error) {
      throw new Error("the JSON schema is not valid JSON: " + error.message);
    }
    b.response_format = { type: "json_schema", json_schema: { name: "answer", schema } };
  }
  return b;
}

async function ask(question) {
  history.push({ role: "user", content: question });
  bubble("user", question);
  const answer = bubble("assistant", "");
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  let text = "";
  let thought = null;  // the <details> showing the thought, made when one arrives
  try {
    const request = JSON.stringify(body());
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: request, signal: controller.signal,
    });
    if (!response.ok) {
      const err = await response.json().catch(() => ({}));
      if (response.status === 401) {
        $("api_key").focus();
        throw new Error("this server needs its API key: enter it in the key field and ask again");
      }
      throw new Error((err.error && err.error.message) || response.statusText);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut).trim();
        buffer = buffer.slice(cut + 2);
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        for (const choice of chunk.choices || []) {
          if (choice.delta && choice.delta.reasoning_content) {
            if (!thought) {
              thought = document.createElement("details");
              thought.className = "thought";
              thought.open = true;
              thought.appendChild(document.createElement("summary")).textContent = "thought";
              thought.appendChild(document.createElement("div"));
              answer.before(thought);
            }
            thought.lastChild.textContent += choice.delta.reasoning_content;
            $("messages").scrollTop = $("messages").scrollHeight;
          }
          if (choice.delta && choice.delta.content) {
            text += choice.delta.content;
            answer.textContent = text;
            $("messages").scrollTop = $("messages").scrollHeight;
          }
          if (choice.finish_reason && chunk.timings) {
            const line = document.createElement("div");
            line.className = "timings";
            line.textContent = describe(chunk.timings);
            answer.after(line);
          }
        }
      }
    }
    history.push({ role: "assistant", content: text });
  } catch (error) {
    if (error.name !== "AbortError") {
      answer.className = "message error";
      answer.textContent = (text ? text + "\n\n" : "") + "error: " + error.message;
    } else if (text) {
      history.push({ role: "assistant", content: text });
    }
  } finally {
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

$("ask").addEventListener("submit", (event) => {
  event.preventDefault();
  const question = $("input").value.trim();
  if (!question || controller) return;
  $("input").value = "";
  ask(question);
});
$("input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("ask").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  history.length = 0;
  $("messages").textContent = "";
});
function showModel() {
  fetch("/v1/models", { headers: headers() })
    .then((r) => {
      if (r.status === 401) $("api_key").focus();
      return r.json();
    })
    .then((m) => { $("model").textContent = m.data ? m.data[0].id : "(enter the API key)"; })
    .catch(() => { $("model").textContent = "(not reachable)"; });
}
$("api_key").addEventListener("change", showModel);
$("format").addEventListener("change", () => {
  $("schema_label").hidden = $("format").value !== "json_schema";
});
showModel();
