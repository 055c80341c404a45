// llmgw admin: keeps the status parts of a page current, shows times in the
// viewer's zone, and copies a new key.
//
// Every element with data-refresh="URL" is replaced, every data-every seconds,
// by a fresh copy of that fragment, rendered by the server like the page
// itself. No framework and no build step. Forms are never inside a refreshed
// element, so a refresh cannot lose what someone is typing. Polling pauses
// while the tab is hidden. A fragment answers 401 once the session is over;
// polling then stops and says so, rather than pasting a sign-in page into
// the middle of this one.
"use strict";

(function () {
  function note(el, text) {
    let p = el.previousElementSibling;
    if (!p || !p.classList.contains("refresh-note")) {
      p = document.createElement("p");
      p.className = "refresh-note";
      p.setAttribute("role", "status");
      el.parentNode.insertBefore(p, el);
    }
    p.textContent = text;
    p.hidden = !text;
  }

  function watch(el) {
    const url = el.dataset.refresh;
    const every = Math.max(2, Number(el.dataset.every) || 5) * 1000;

    async function tick() {
      if (!document.hidden) {
        try {
          const r = await fetch(url, {
            credentials: "same-origin",
            cache: "no-store",
            redirect: "error",
            headers: { Accept: "text/html" },
          });
          if (r.status === 401) {
            note(el, "Your session has ended: reload the page to sign in again.");
            return;
          }
          if (!r.ok) {
            note(el, "Refreshing failed (HTTP " + r.status + "); retrying.");
          } else {
            el.innerHTML = await r.text();
            el.dataset.refreshed = String(Date.now());
            note(el, "");
          }
        } catch (err) {
          note(el, "The server cannot be reached; retrying.");
        }
      }
      setTimeout(tick, every);
    }

    setTimeout(tick, every);
  }

  // Times arrive as <time datetime="2026-12-01T23:00:00Z">2026-12-01 23:00 UTC</time>:
  // readable without script, in UTC. Here they are rewritten in the viewer's own
  // zone, ISO-like (2026-12-02 00:00 CET), with the UTC text kept on hover.
  function pad(n) { return String(n).padStart(2, "0"); }
  function zoneName(d) {
    try {
      const part = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" })
        .formatToParts(d).find((p) => p.type === "timeZoneName");
      return part ? part.value : "";
    } catch (err) {
      return "";
    }
  }
  function localise(root) {
    root.querySelectorAll("time[datetime]:not([data-local])").forEach((t) => {
      const d = new Date(t.getAttribute("datetime"));
      if (Number.isNaN(d.getTime())) return;
      const day = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate());
      const clock = pad(d.getHours()) + ":" + pad(d.getMinutes());
      const short = t.dataset.format === "hour" ? clock : day + " " + clock;
      if (!t.title) t.title = t.textContent.trim();
      t.textContent = short + (t.dataset.format === "hour" ? "" : " " + zoneName(d));
      t.dataset.local = "1";
    });
  }

  // The usage chart's hour labels: <text data-time="..." data-format="hour"> in UTC, in
  // the viewer's zone here (day labels stay UTC days, the ledger's). The UTC text is
  // kept in the label's <title>.
  function localiseChart(root) {
    root.querySelectorAll("svg text[data-time][data-format=hour]:not([data-local])")
      .forEach((t) => {
        const d = new Date(t.dataset.time);
        if (Number.isNaN(d.getTime())) return;
        t.firstChild.textContent = pad(d.getHours()) + ":" + pad(d.getMinutes());
        t.dataset.local = "1";
      });
  }

  // A button with data-copy="ID" copies the text of element ID.
  document.addEventListener("click", async (ev) => {
    const b = ev.target.closest("button[data-copy]");
    if (!b) return;
    const source = document.getElementById(b.dataset.copy);
    const said = b.parentNode.querySelector(".copied");
    try {
      await navigator.clipboard.writeText(source.textContent.trim());
      if (said) said.textContent = "copied";
    } catch (err) {
      const range = document.createRange();
      range.selectNodeContents(source);
      const sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      if (said) said.textContent = "selected: press Ctrl+C (⌘C) to copy";
    }
  });

  localise(document);
  localiseChart(document);
  new MutationObserver(() => { localise(document); localiseChart(document); }).observe(document.body,
    { childList: true, subtree: true });
  document.querySelectorAll("[data-refresh]").forEach(watch);
})();
