"use strict";
// ZipRL trajectory viewer. Every value from the data is put on the page as a text node or an attribute
// set through the DOM; nothing is ever parsed as HTML (no innerHTML), and links are built from numbers.
(function () {
  const PAGE = 50, CHUNK = 40;
  const index = JSON.parse(document.getElementById("ziprl-index").textContent);
  const C = Object.fromEntries(index.columns.map((c, i) => [c, i]));
  const rows = index.rows;
  const embedded = document.getElementById("ziprl-episodes");
  let episodes = null;  // static page: parsed on first use
  const cache = new Map();

  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "class") e.className = v;
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of kids.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  const fmt = (v) => (v === null || v === undefined) ? "–" :
    (typeof v === "number" && !Number.isInteger(v)) ? v.toFixed(3) : String(v);
  const epLink = (id, ...kids) => h("a", { href: "#/ep/" + Number(id) }, ...kids);

  function getEpisode(id) {
    id = Number(id);
    if (cache.has(id)) return Promise.resolve(cache.get(id));
    if (embedded) {
      episodes = episodes || JSON.parse(embedded.textContent);
      const ep = episodes[String(id)];
      return ep ? Promise.resolve(ep) : Promise.reject(new Error("no episode " + id));
    }
    return fetch("api/episode/" + id).then((r) => {
      if (!r.ok) throw new Error("episode " + id + ": HTTP " + r.status);
      return r.json();
    }).then((ep) => { cache.set(id, ep); return ep; });
  }

  // ---------------------------------------------------------------- episode list
  const state = { sort: "id", dir: 1, page: 0, strategy: "", source: "", finished: "", errors: "", rmin: "", rmax: "", text: "" };
  const listView = document.getElementById("view-list");
  const body = h("tbody");
  const pager = h("div", { class: "pager" });
  const LIST_COLS = [["id", "#"], ["question", "question"], ["gold", "gold"], ["answer", "final answer"],
    ["reward", "reward"], ["em", "EM"], ["f1", "F1"], ["turns", "turns"], ["strategy", "strategy"],
    ["version", "policy ver."], ["step", "step"], ["finished", "finished"], ["errors", "format errors"],
    ["tokens", "resp. tokens"], ["source", "file"]];
  const NUMERIC = new Set(["id", "reward", "em", "f1", "turns", "version", "step", "errors", "tokens"]);

  function select(key, label, options) {
    return h("label", {}, label + " ", h("select", { "data-key": key, onchange: (e) => { state[key] = e.target.value; state.page = 0; renderRows(); } },
      options.map(([v, t]) => h("option", { value: v }, t))));
  }
  function input(key, label, type, size) {
    return h("label", {}, label + " ", h("input", { type, size, step: type === "number" ? "0.1" : null, "data-key": key,
      oninput: (e) => { state[key] = e.target.value; state.page = 0; renderRows(); } }));
  }
  function buildList() {
    const strategies = [...new Set(rows.map((r) => r[C.strategy]))].sort();
    const head = h("tr", {}, LIST_COLS.map(([key, label]) => h("th", {
      class: NUMERIC.has(key) ? "num" : null, "data-col": key,
      onclick: () => { state.dir = state.sort === key ? -state.dir : 1; state.sort = key; renderRows(); },
    }, label)));
    listView.append(
      h("div", { class: "controls" },
        input("text", "search", "search", 24),
        select("strategy", "strategy", [["", "all"], ...strategies.map((s) => [s, s])]),
        select("source", "file", [["", "all"], ...index.sources.map((s) => [s, s])]),
        select("finished", "finished", [["", "all"], ["yes", "yes"], ["no", "no"]]),
        select("errors", "format errors", [["", "all"], ["with", "with errors"], ["without", "none"]]),
        input("rmin", "reward ≥", "number", 4), input("rmax", "reward ≤", "number", 4)),
      pager, h("table", { class: "episodes" }, h("thead", {}, head), body));
  }
  function filtered() {
    const t = state.text.toLowerCase(), lo = parseFloat(state.rmin), hi = parseFloat(state.rmax);
    const out = rows.filter((r) =>
      (!state.strategy || r[C.strategy] === state.strategy) && (!state.source || r[C.source] === state.source) &&
      (!state.finished || r[C.finished] === (state.finished === "yes")) &&
      (!state.errors || (r[C.errors] > 0) === (state.errors === "with")) &&
      (isNaN(lo) || r[C.reward] >= lo) && (isNaN(hi) || r[C.reward] <= hi) &&
      (!t || (r[C.question] + " " + r[C.gold] + " " + r[C.answer] + " " + r[C.qid]).toLowerCase().includes(t)));
    const k = C[state.sort], d = state.dir;
    return out.sort((a, b) => {
      const x = a[k], y = b[k];
      if (x === y) return a[C.id] - b[C.id];
      if (x === null) return 1;
      if (y === null) return -1;
      return (x < y ? -1 : 1) * d;
    });
  }
  function renderRows() {
    const list = filtered();
    const pages = Math.max(1, Math.ceil(list.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const shown = list.slice(state.page * PAGE, (state.page + 1) * PAGE);
    body.replaceChildren(...shown.map((r) => h("tr", { "data-id": r[C.id] }, LIST_COLS.map(([key]) => {
      const v = r[C[key]];
      if (key === "question") return h("td", { class: "q" }, epLink(r[C.id], v));
      if (key === "finished") return h("td", {}, v ? "yes" : "no");
      return h("td", { class: NUMERIC.has(key) ? "num" : null }, fmt(v));
    }))));
    pager.replaceChildren(
      h("button", { disabled: state.page === 0, onclick: () => { state.page--; renderRows(); } }, "‹ prev"),
      h("span", { id: "page-info" }, `page ${state.page + 1} of ${pages} · ${list.length} of ${rows.length} episodes`),
      h("button", { disabled: state.page >= pages - 1, onclick: () => { state.page++; renderRows(); } }, "next ›"));
    for (const th of listView.querySelectorAll("th")) {
      th.textContent = LIST_COLS.find(([k]) => k === th.dataset.col)[1] + (th.dataset.col === state.sort ? (state.dir > 0 ? " ▲" : " ▼") : "");
    }
  }

  // ---------------------------------------------------------------- one episode
  function longText(label, text, openIfShort) {
    if (text === null || text === undefined || text === "") return null;
    return h("details", { open: openIfShort && text.length <= 400 }, h("summary", {}, `${label} (${text.length} chars)`), h("pre", {}, text));
  }
  function qcomBars(t) {
    if (t.q_com === null || t.q_com === undefined) return null;
    const parts = [["Q_com", t.q_com, "total"], ["ratio", t.q_ratio], ["level", t.q_level], ["info", t.q_info], ["sem", t.q_sem]];
    return h("div", { class: "qcom", title: "Q_com and its four parts" }, parts.map(([name, v, cls]) => {
      const inner = h("div");
      inner.style.width = Math.round(100 * Math.max(0, Math.min(1, v || 0))) + "%";
      return [h("span", {}, name), h("div", { class: "bar" + (cls ? " " + cls : "") }, inner), h("span", { class: "num" }, fmt(v))];
    }));
  }
  function memoryBlock(t, strategy) {
    if (t.memory) return longText("Context: memory notes the model saw", t.memory, false);
    if (strategy === "react") return h("div", { class: "muted" }, "Context: the full history so far (react keeps every raw observation)");
    const notes = t.memory_before || [];
    if (!notes.length) return h("div", { class: "muted" }, "Context: memory empty");
    return h("details", {}, h("summary", {}, `Context: ${notes.length} memory note(s) from earlier turns`),
      notes.map((n) => h("div", { class: "note" }, h("span", { class: "muted" }, `[turn ${n.turn}, level ${fmt(n.level)}] `), n.text)));
  }
  function renderTurn(t, next, strategy) {
    const action = t.action || "invalid";
    const tokens = `prompt ${fmt(t.prompt_tokens)} tok · response ${fmt(t.response_tokens)} tok · observation ${fmt(t.observation_chars)} chars · context ${fmt(t.context_chars)} chars`;
    const extra = Object.entries(t.extra || {}).filter(([, v]) => v !== null && v !== undefined);
    return h("div", { class: "turn" + (t.format_error ? " has-error" : ""), id: "turn-" + Number(t.turn), "data-turn": t.turn },
      h("div", { class: "turn-head" }, h("strong", {}, "Turn " + t.turn), h("span", { class: "badge " + action }, action),
        t.level !== null && t.level !== undefined ? h("span", { class: "badge" }, "level " + t.level) : null,
        h("span", { class: "meta" }, tokens)),
      t.format_error ? h("div", { class: "format-error" }, "Format error: " + t.format_error) : null,
      t.notice ? h("div", { class: "notice" }, "Notice shown: " + t.notice) : null,
      memoryBlock(t, strategy),
      t.observation !== undefined && t.observation !== null
        ? longText("Raw observation" + (t.observation_label ? " · " + t.observation_label : ""), t.observation, false)
        : (t.observation_chars ? h("div", { class: "muted" }, `Raw observation: ${t.observation_chars} chars (not decoded)`) : null),
      t.note !== null && t.note !== undefined
        ? h("div", { class: "note" }, h("span", { class: "muted" }, `Compression note (level ${fmt(t.note_level)}): `), t.note) : null,
      qcomBars(t),
      t.argument !== null && t.argument !== undefined
        ? h("div", {}, h("span", { class: "muted" }, action + ": "), h("span", { class: "argument" }, t.argument),
          next && next.observation_chars ? h("span", { class: "muted" }, ` → result: ${next.observation_chars} chars (turn ${next.turn})`) : null)
        : null,
      longText("Raw response", t.response, false),
      extra.length ? h("div", { class: "muted" }, extra.map(([k, v]) => `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`).join(" · ")) : null);
  }
  function renderEpisode(ep, compact) {
    const turns = ep.turns || [];
    const list = h("div", { class: "turns" });
    let shown = 0;
    const more = h("div", { class: "more" });
    function showUpTo(n) {
      const upto = Math.min(turns.length, n);
      for (; shown < upto; shown++) list.append(renderTurn(turns[shown], turns[shown + 1], ep.strategy));
      more.replaceChildren(shown < turns.length
        ? h("button", { onclick: () => showUpTo(shown + CHUNK) }, `show ${Math.min(CHUNK, turns.length - shown)} more turns (${turns.length - shown} left)`)
        : "");
    }
    showUpTo(CHUNK);
    const strip = h("div", { class: "strip" }, turns.map((t) => h("a", {
      class: t.action || "invalid", title: `turn ${t.turn}: ${t.action}${t.format_error ? " (format error)" : ""}`,
      onclick: (e) => { e.preventDefault(); showUpTo(t.turn); list.children[t.turn - 1].scrollIntoView(); },
    })));
    const others = rows.filter((r) => r[C.qid] === ep.qid && r[C.id] !== ep.id);
    const summary = h("div", { class: "summary" },
      h("h2", { class: "question" }, ep.question),
      h("dl", {},
        h("dt", {}, "gold"), h("dd", { class: "gold" }, (ep.gold || []).join(" | ")),
        h("dt", {}, "final answer"), h("dd", { class: "final-answer" }, ep.answer || "(none)"),
        h("dt", {}, "reward / EM / F1"), h("dd", {}, `${fmt(ep.reward)} / ${fmt(ep.em)} / ${fmt(ep.f1)}`),
        h("dt", {}, "strategy"), h("dd", { class: "strategy" }, ep.strategy),
        h("dt", {}, "file · step · policy version"), h("dd", {}, `${ep.source} · ${fmt(ep.step)} · ${fmt(ep.version)}`),
        h("dt", {}, "turns · finished"), h("dd", {}, `${turns.length} · ${ep.finished ? "yes" : "no"}`),
        compact || !others.length ? null : h("dt", {}, "side by side with"),
        compact || !others.length ? null : h("dd", {}, others.slice(0, 20).map((r) => [h("a", {
          class: "compare-link", href: "#/cmp/" + Number(ep.id) + "/" + Number(r[C.id]),
        }, `${r[C.source]} (${r[C.strategy]}, sample ${r[C.id]})`), " "]))));
    return h("div", { class: "episode", "data-id": ep.id }, summary, strip, list, more);
  }

  // ---------------------------------------------------------------- routing
  const views = ["list", "episode", "compare", "run"].map((v) => document.getElementById("view-" + v));
  function show(name) { for (const v of views) v.hidden = v.id !== "view-" + name; }
  function fail(view, err) { view.replaceChildren(h("p", { class: "format-error" }, String(err))); }
  function route() {
    const parts = location.hash.replace(/^#\/?/, "").split("/");
    if (parts[0] === "ep" && parts[1] !== undefined) {
      const view = document.getElementById("view-episode");
      show("episode");
      view.replaceChildren(h("p", { class: "muted" }, "loading…"));
      getEpisode(parts[1]).then((ep) => view.replaceChildren(h("a", { href: "#/" }, "← all episodes"), renderEpisode(ep, false)), (e) => fail(view, e));
    } else if (parts[0] === "cmp" && parts[2] !== undefined) {
      const view = document.getElementById("view-compare");
      show("compare");
      view.replaceChildren(h("p", { class: "muted" }, "loading…"));
      Promise.all([getEpisode(parts[1]), getEpisode(parts[2])]).then(([a, b]) => view.replaceChildren(
        h("div", { class: "cols" }, h("div", { class: "col" }, renderEpisode(a, true)), h("div", { class: "col" }, renderEpisode(b, true)))),
        (e) => fail(view, e));
    } else if (parts[0] === "run") {
      show("run");
    } else {
      show("list");
    }
    window.scrollTo(0, 0);
  }
  buildList();
  renderRows();
  window.addEventListener("hashchange", route);
  route();
  document.body.dataset.ready = "1";
})();
