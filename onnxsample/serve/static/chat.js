// The chat page: a conversation streamed from /v1/chat/completions, with the sampling controls.
"use strict";

const $ = (id) => document.getElementById(id);
const history = [];  // the turns sent with each question: user and assistant, alternating
let controller = null;  // the streaming answer's, while one streams
let conversation = 0;  // "New conversation" counts up: an answer of an older one is dropped

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

function body(question) {
  // a thinking model's thought arrives apart (reasoning_content) and stays out of the history
  const b = { messages: [], stream: true, stream_options: { include_usage: true },
              reasoning_format: "auto" };
  const system = $("system").value.trim();
  if (system) b.messages.push({ role: "system", content: system });
  b.messages.push(...history, { role: "user", content: question });
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

function busy(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
}

// A line under an answer (after its timings): why it ended early.
function note(after, text, kind) {
  const div = document.createElement("div");
  div.className = "note" + (kind ? " " + kind : "");
  div.textContent = text;
  after.after(div);
  $("messages").scrollTop = $("messages").scrollHeight;
}

// finish_reason "length": the request's max_tokens or the model's context cut the answer.
function cutBy(limit, generated, total) {
  if (limit > 0 && generated >= limit) {
    return `cut at the max tokens limit (${limit}): raise Max tokens for a longer answer`;
  }
  return "cut: the conversation filled the model's context" + (total ? ` (${total} tokens)` : "") +
         ": start a new conversation for more";
}

// fetch and reading its body fail with a TypeError when the network does ("Failed to fetch",
// "network error"): say what happened in words.
function unreachable(error, what) {
  return error.name === "TypeError" ? new Error(what) : error;
}

// The question goes into the history with its answer once there is one (whole, stopped or
// broken off): a turn that fails before any answer leaves the conversation as it was.
async function ask(question) {
  const turn = conversation;
  const mine = new AbortController();
  controller = mine;
  busy(true);
  const asked = bubble("user", question);
  const answer = bubble("assistant", "");
  let last = answer;  // the answer's last line on the page (its timings, once they come)
  let text = "";
  let thought = null;  // the <details> showing the thought, made when one arrives
  let finish = null;
  let limit;
  let generated = 0;
  let total = 0;
  let failure = null;
  try {
    const request = body(question);
    limit = request.max_tokens;
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(request), signal: mine.signal,
    }).catch((error) => {
      throw unreachable(error, "the server could not be reached: is it running?");
    });
    if (!response.ok) {
      const err = await response.json().catch(() => ({}));
      if (response.status === 401) {
        $("api_key").focus();
        throw new Error("this server needs its API key: enter it in the key field and ask again");
      }
      throw new Error((err.error && err.error.message) || `${response.status} ${response.statusText}`);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read().catch((error) => {
        throw unreachable(error, "the connection to the server broke");
      });
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
        if (chunk.usage) {
          generated = chunk.usage.completion_tokens;
          total = chunk.usage.total_tokens;
        }
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
          if (choice.finish_reason) {
            finish = choice.finish_reason;
            if (chunk.timings) {
              generated = chunk.timings.predicted_n;
              last = document.createElement("div");
              last.className = "timings";
              last.textContent = describe(chunk.timings);
              answer.after(last);
            }
          }
        }
      }
    }
    // a stream that ends without saying how (no finish_reason, no error) was cut off
    if (finish === null) throw new Error("the answer ended before it finished");
  } catch (error) {
    failure = error;
  } finally {
    if (controller === mine) {
      controller = null;
      busy(false);
    }
  }
  if (turn !== conversation) return;  // "New conversation" ended it: none of it is kept
  const stopped = failure !== null && failure.name === "AbortError";
  if (failure === null || text) {  // an answer, maybe cut: the turn joins the conversation
    history.push({ role: "user", content: question }, { role: "assistant", content: text });
    if (stopped) {
      note(last, "stopped: the answer so far stays in the conversation");
    } else if (failure) {
      note(last, "error: " + failure.message + " — the answer so far stays in the conversation",
           "error");
    } else if (finish === "length") {
      note(last, cutBy(limit, generated, total));
    }
    return;
  }
  // no answer: this turn stays out of the conversation, its question back in the box
  asked.classList.add("failed");
  asked.title = "not sent again: this question is left out of the conversation";
  const back = !$("input").value.trim();  // (not over what was typed since)
  if (back) $("input").value = question;
  answer.className = "message error";
  answer.textContent = (stopped ? "stopped before any answer" : "error: " + failure.message) +
    "\nThis question is left out of the conversation" +
    (back ? "; it is back in the box below to send again." : ".");
}

$("ask").addEventListener("submit", (event) => {
  event.preventDefault();
  const question = $("input").value.trim();
  if (!question || controller) return;
  $("input").value = "";
  ask(question);
});
$("input").addEventListener("keydown", (event) => {
  // an Enter that ends an IME composition (Japanese, Chinese…) picks the words, not sends
  if (event.isComposing || event.keyCode === 229) return;
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("ask").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  // as Stop, and the answer streaming now is no part of the new conversation
  conversation += 1;
  history.length = 0;
  if (controller) {
    controller.abort();
    controller = null;
    busy(false);
  }
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
