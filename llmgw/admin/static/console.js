// llmgw console: the parts of its pages that run in the browser (the live model view,
// the playground) and the viewer's zone offset for date fields.
//
// No framework, no build step, no inline script (the policy is default-src 'self').
"use strict";

(function () {
  // A datetime-local field is in the viewer's zone: the server is told its offset.
  // (Instants shown are localised by admin.js, copy buttons handled there too.)
  document.querySelectorAll("input[data-tz-offset]").forEach(function (el) {
    el.value = String(new Date().getTimezoneOffset());
  });

  // -- the live model view: the table's rows rebuilt from /admin/live.json ---------

  function secs(v) {
    if (v === null || v === undefined) return "—";
    return v < 1 ? Math.round(v * 1000) + " ms" : v.toFixed(2) + " s";
  }
  function pct(v) { return v === null || v === undefined ? "—" : (v * 100).toFixed(1) + "%"; }
  function rate(v) { return v === null || v === undefined ? "—" : v.toFixed(2); }

  function cell(tr, cls, text) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    if (text !== undefined) td.textContent = text;
    tr.appendChild(td);
    return td;
  }

  function liveRow(r) {
    const f = r.figures;
    const tr = document.createElement("tr");
    tr.dataset.model = f.model;
    const name = cell(tr, "");
    const a = document.createElement("a");
    a.href = "/admin/models/" + encodeURIComponent(f.model);
    a.textContent = f.model;
    name.appendChild(a);
    cell(tr, "num", rate(f.requests_per_s)).dataset.fig = "rps";
    const errors = cell(tr, "");
    errors.dataset.fig = "errors";
    const statuses = Object.keys(f.errors);
    if (!statuses.length) errors.textContent = f.requests ? "none" : "—";
    statuses.forEach(function (s) {
      const tag = document.createElement("span");
      tag.className = "tag status-" + s[0] + "xx";
      tag.textContent = s + ": " + pct(f.errors[s]);
      errors.appendChild(tag);
      errors.appendChild(document.createTextNode(" "));
    });
    cell(tr, "num", secs(f.ttft_p50) + " / " + secs(f.ttft_p95)).dataset.fig = "ttft";
    cell(tr, "num", secs(f.latency_p50) + " / " + secs(f.latency_p95)).dataset.fig = "latency";
    cell(tr, "num", rate(f.tokens_per_s)).dataset.fig = "tps";
    cell(tr, "num", f.queued + " / " + (f.rejected_429 === null ? "—" : Math.round(f.rejected_429)))
      .dataset.fig = "queue";
    const reps = cell(tr, "");
    reps.dataset.fig = "replicas";
    reps.textContent = r.external
      ? f.healthy + (f.healthy === 1 ? " upstream" : " upstreams") + " healthy"
      : r.ready + " / " + r.desired + " ready";
    if (f.ejected) reps.textContent += ", " + f.ejected + " ejected";
    if (r.reason) {
      const sub = document.createElement("div");
      sub.className = "sub";
      sub.textContent = r.reason;
      reps.appendChild(sub);
    }
    cell(tr, "num", pct(f.prefix_hit_rate)).dataset.fig = "prefix";
    return tr;
  }

  function watchLive(table) {
    const every = Math.max(2, Number(table.dataset.every) || 5) * 1000;
    const note = document.getElementById("live-window");
    async function tick() {
      if (!document.hidden) {
        try {
          const r = await fetch(table.dataset.source, {
            credentials: "same-origin", cache: "no-store", redirect: "error",
            headers: { Accept: "application/json" },
          });
          if (r.status === 401) {
            note.textContent = "Your session has ended: reload the page to sign in again.";
            return;
          }
          if (r.ok) {
            const view = await r.json();
            const body = table.tBodies[0];
            body.replaceChildren.apply(body, view.rows.map(liveRow));
            if (!view.rows.length) {
              const tr = document.createElement("tr");
              const td = cell(tr, "empty", "no model has replicas wanted or traffic now");
              td.colSpan = 9;
              body.appendChild(tr);
            }
            const refused = document.querySelector("#live-refused [data-fig=refused]");
            if (refused) {
              const f = view.refused;
              const parts = Object.keys(f.errors).map(function (s) {
                return s + ": " + Math.round(f.errors[s] * f.requests);
              });
              refused.textContent = parts.length ? parts.join(" ") : "none";
              const span = document.querySelector("#live-refused [data-fig=refused-window]");
              if (span) {
                span.textContent = view.window ? " in the last " + Math.round(view.window) + " s" : "";
              }
            }
            table.dataset.refreshed = String(Date.now());
            note.textContent = (view.window
              ? "Rates over the last " + Math.round(view.window) + " s"
              : "Rates appear at the next refresh") +
              ". From the gateway's own metrics; refreshed every " + every / 1000 + " s.";
          }
        } catch (err) {
          note.textContent = "The server cannot be reached; retrying.";
        }
      }
      setTimeout(tick, every);
    }
    setTimeout(tick, every);
  }

  const liveTable = document.getElementById("live-table");
  if (liveTable) watchLive(liveTable);

  // -- the playground: a streamed chat through the gateway, measured here ----------

  function playground(root) {
    const $ = function (id) { return document.getElementById(id); };
    const chat = $("pg-chat");
    const error = $("pg-error");
    let history = [];
    let minted = null;   // {key, team}: a team's playground key, held here only

    function say(role, text) {
      const li = document.createElement("li");
      li.className = "msg-" + role;
      const who = document.createElement("b");
      who.textContent = role === "user" ? "you" : "model";
      const body = document.createElement("div");
      body.className = "said";
      body.textContent = text;
      li.append(who, body);
      chat.appendChild(li);
      return body;
    }

    function fail(text) {
      error.textContent = text;
      error.hidden = false;
    }

    function pyString(s) { return JSON.stringify(s); }

    function showRequest(body) {
      const base = root.dataset.base;
      const json = JSON.stringify(body, null, 2);
      $("pg-curl").textContent =
        "curl -N " + base + "/v1/chat/completions \\\n" +
        "  -H \"Authorization: Bearer $LLMGW_API_KEY\" \\\n" +
        "  -H \"Content-Type: application/json\" \\\n" +
        "  -d '" + json.replace(/'/g, "'\\''") + "'";
      const msgs = body.messages.map(function (m) {
        return "        {\"role\": " + pyString(m.role) + ", \"content\": " + pyString(m.content) + "},";
      }).join("\n");
      $("pg-python").textContent =
        "import os\nfrom openai import OpenAI\n\n" +
        "client = OpenAI(base_url=" + pyString(base + "/v1") + ", api_key=os.environ[\"LLMGW_API_KEY\"])\n" +
        "stream = client.chat.completions.create(\n" +
        "    model=" + pyString(body.model) + ",\n" +
        "    messages=[\n" + msgs + "\n    ],\n" +
        "    max_tokens=" + body.max_tokens + ",\n" +
        "    stream=True,\n" +
        "    stream_options={\"include_usage\": True},\n)\n" +
        "for chunk in stream:\n" +
        "    if chunk.choices and chunk.choices[0].delta.content:\n" +
        "        print(chunk.choices[0].delta.content, end=\"\", flush=True)\n";
    }

    async function keyToUse() {
      const as = root.querySelector("input[name=as]:checked").value;
      if (as === "key") {
        const k = $("pg-key").value.trim();
        if (!k) throw new Error("paste a key's secret, or choose a team to act as");
        return k;
      }
      const team = $("pg-team").value;
      if (!team) throw new Error("there is no team to act as; create one on the Usage page");
      if (minted && minted.team === team) return minted.key;
      const r = await fetch("/admin/playground/key", {
        method: "POST", credentials: "same-origin", redirect: "error",
        headers: { "Content-Type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams({ csrf: root.dataset.csrf, team: team }),
      });
      const answer = await r.json();
      if (!r.ok) throw new Error(answer.error || ("HTTP " + r.status));
      minted = { key: answer.key, team: team, at: Date.now() };
      return answer.key;
    }

    async function whichReplica(tag) {
      if (!tag) return "—";
      const r = await fetch("/admin/playground/replica?tag=" + encodeURIComponent(tag),
        { credentials: "same-origin", redirect: "error" });
      if (!r.ok) return tag;
      const a = await r.json();
      if (a.replica) return a.replica + (a.node ? " on " + a.node : "");
      if (a.upstream) return "upstream " + a.upstream;
      return tag + " (no longer running)";
    }

    async function send(ev) {
      ev.preventDefault();
      error.hidden = true;
      const prompt = $("pg-prompt").value.trim();
      if (!prompt) return;
      const go = $("pg-go");
      go.disabled = true;
      ["pg-ttft", "pg-tps", "pg-tokens", "pg-model-served", "pg-replica", "pg-request-id"]
        .forEach(function (id) { $(id).textContent = "…"; });
      try {
        const key = await keyToUse();
        history.push({ role: "user", content: prompt });
        say("user", prompt);
        const body = {
          model: $("pg-model").value.trim(), messages: history.slice(),
          max_tokens: Number($("pg-max").value) || 128, stream: true,
          stream_options: { include_usage: true },
        };
        showRequest(body);
        const out = say("assistant", "");
        const started = performance.now();
        let r;
        for (;;) {
          r = await fetch("/v1/chat/completions", {
            method: "POST", credentials: "omit", redirect: "error",
            headers: { "Content-Type": "application/json", Authorization: "Bearer " + key },
            body: JSON.stringify(body),
          });
          // Gateways put a new key in force within a second of its creation (they poll
          // the store): a key made a moment ago is tried again rather than refused.
          if (r.status !== 401 || !minted || minted.key !== key ||
              Date.now() - minted.at > 10000) break;
          await new Promise(function (done) { setTimeout(done, 250); });
        }
        $("pg-request-id").textContent = r.headers.get("x-request-id") || "—";
        $("pg-model-served").textContent = r.headers.get("x-llmgw-model") || "—";
        const tag = r.headers.get("x-llmgw-replica");
        if (!r.ok) {
          let text = "HTTP " + r.status;
          try { text += ": " + (await r.json()).error.message; } catch (e) { /* not JSON */ }
          history.pop();
          out.parentNode.remove();
          throw new Error(text);
        }
        const reader = r.body.getReader();
        const decoder = new TextDecoder();
        let buffer = "", text = "", first = null, usage = null;
        for (;;) {
          const part = await reader.read();
          if (part.done) break;
          buffer += decoder.decode(part.value, { stream: true });
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const event = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            event.split("\n").forEach(function (line) {
              if (!line.startsWith("data:")) return;
              const data = line.slice(5).trim();
              if (data === "[DONE]") return;
              const chunk = JSON.parse(data);
              if (chunk.error) throw new Error(chunk.error.message || "the stream broke");
              if (chunk.usage) usage = chunk.usage;
              const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
              if (delta && delta.content) {
                if (first === null) {
                  first = performance.now();
                  $("pg-ttft").textContent = secs((first - started) / 1000);
                }
                text += delta.content;
                out.textContent = text;
              }
            });
          }
        }
        const ended = performance.now();
        history.push({ role: "assistant", content: text });
        if (first === null) $("pg-ttft").textContent = "no tokens";
        if (usage) {
          $("pg-tokens").textContent = usage.prompt_tokens + " prompt, " +
            usage.completion_tokens + " completion";
          const span = first === null ? 0 : (ended - first) / 1000;
          $("pg-tps").textContent = span > 0 && usage.completion_tokens > 1
            ? ((usage.completion_tokens - 1) / span).toFixed(1) : "—";
        } else {
          $("pg-tokens").textContent = "not reported";
          $("pg-tps").textContent = "—";
        }
        $("pg-replica").textContent = await whichReplica(tag);
        root.dataset.answered = String(history.length);
      } catch (err) {
        fail(err.message);
      } finally {
        go.disabled = false;
      }
    }

    $("pg-send").addEventListener("submit", send);
    $("pg-clear").addEventListener("click", function () {
      history = [];
      chat.replaceChildren();
    });
  }

  const pg = document.getElementById("playground");
  if (pg) playground(pg);

})();
