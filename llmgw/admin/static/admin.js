// llmgw admin: keeps the status parts of a page current.
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

  document.querySelectorAll("[data-refresh]").forEach(watch);
})();
