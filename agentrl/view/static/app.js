// agentrl view: the page. Routes (location.hash):
//   #/                                   the runs and evaluations under the viewed path
//   #/run/<id>                           a run's curves, evals, flags and rollouts
//   #/run/<id>/rollout/<file>            the episodes of one rollout (filter, sort, page)
//   #/run/<id>/rollout/<file>/group/<g>  one group's samples side by side, with advantages
//   #/run/<id>/sample/<file>/<line>      one episode: conversation, tokens, grade, commands
//   #/eval/<id>                          an evaluation: pass@k per set and its episodes
//   #/eval/<id>/sample/<line>            one evaluated episode
"use strict";

const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
const problemsBox = document.getElementById("problems");
let pollTimer = null;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
}

async function api(path, params) {
  const url = path + "?" + new URLSearchParams(params || {}).toString();
  const response = await fetch(url);
  let body;
  try { body = await response.json(); } catch (e) { throw new Error(`${path}: the server answered ${response.status} without JSON`); }
  if (!response.ok || body.error) throw new Error(body.error || `${path}: HTTP ${response.status}`);
  return body;
}

function showProblems(list) {
  problemsBox.innerHTML = "";
  problemsBox.hidden = !list || !list.length;
  for (const p of list || []) problemsBox.append(h("div", {class: "problem"}, p));
}

function showError(message) {
  main.innerHTML = "";
  main.append(h("div", {class: "error", id: "error"}, message));
}

function setCrumbs(items) {
  crumbs.innerHTML = "";
  items.forEach(([label, href], i) => {
    if (i) crumbs.append(" / ");
    crumbs.append(href ? h("a", {href}, label) : h("span", {}, label));
  });
}

const enc = encodeURIComponent;
const runHref = (id) => `#/run/${enc(id)}`;
const runLabel = (id) => (id === "." ? "this run" : id);
const evalHref = (id) => `#/eval/${enc(id)}`;

// -- routing -----------------------------------------------------------------------------------

async function route() {
  clearInterval(pollTimer);
  pollTimer = null;
  document.getElementById("live").textContent = "";
  showProblems([]);
  // ids are paths: links encode them whole, and a typed path with "/" in it still works (the
  // route's keywords are read from the right)
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const [kind, rest] = [parts[0], parts.slice(1)];
  const n = rest.length;
  const id = (drop) => rest.slice(0, n - drop).join("/");
  try {
    if (kind === "run" && n >= 5 && rest[n - 4] === "rollout" && rest[n - 2] === "group") await groupPage(id(4), rest[n - 3], rest[n - 1]);
    else if (kind === "run" && n >= 4 && rest[n - 3] === "sample") await episodePage({kind: "run", id: id(3), file: rest[n - 2], line: rest[n - 1]});
    else if (kind === "run" && n >= 3 && rest[n - 2] === "rollout") await tablePage({kind: "run", id: id(2), file: rest[n - 1]});
    else if (kind === "run" && n >= 1) await runPage(id(0));
    else if (kind === "eval" && n >= 3 && rest[n - 2] === "sample") await episodePage({kind: "eval", id: id(2), line: rest[n - 1]});
    else if (kind === "eval" && n >= 1) await evalPage(id(0));
    else await homePage();
  } catch (err) {
    showError(err.message);
  }
}
window.addEventListener("hashchange", route);

async function homePage() {
  const data = await api("/api/targets");
  if (data.targets.length === 1 && !location.hash.includes("list")) {
    const t = data.targets[0];
    location.replace(t.kind === "run" ? runHref(t.id) : evalHref(t.id));
    return;
  }
  setCrumbs([[data.root, null]]);
  main.innerHTML = "";
  main.append(h("h1", {}, data.root));
  const list = h("ul", {class: "targets"});
  for (const t of data.targets) {
    list.append(h("li", {}, h("span", {class: `tag ${t.kind}`}, t.kind), " ",
      h("a", {href: t.kind === "run" ? runHref(t.id) : evalHref(t.id)}, t.title)));
  }
  main.append(list);
}

// -- a run -------------------------------------------------------------------------------------

const CHARTS = [
  ["Reward mean", (k) => k === "rollout/reward_mean"],
  ["Success rate", (k) => k === "rollout/success_rate"],
  ["Loss parts", (k) => /^train\/.*loss$/.test(k)],
  ["KL", (k) => /^train\/.*kl/.test(k) && !/loss$/.test(k)],
  ["Entropy", (k) => k === "train/entropy"],
  ["Clip fraction", (k) => /^train\/.*clip.*fraction$/.test(k)],
  ["Grad norm", (k) => k === "train/grad_norm"],
  ["Tokens per second", (k) => /tokens_per_s$/.test(k)],
  ["Agent sessions (gateway)", (k) => /^rollout\/gateway\//.test(k)],
  ["Async: staleness (versions)", (k) => k === "async/staleness_mean" || k === "async/staleness_max"],
  ["Async: trainer wait and admission (s)", (k) => k === "async/trainer_wait_s" || k === "async/admission_blocked_s"],
  ["Async: groups in flight", (k) => k === "async/groups_in_flight" || k === "async/groups_ready"],
];
const STAGES = ["rollout", "train", "weight_sync", "eval", "save"];

function seriesOf(metrics, key, suffix, dashed) {
  const points = metrics.filter((m) => typeof m[key] === "number" && typeof m.rollout_id === "number")
    .map((m) => [m.rollout_id, m[key]]);
  return {name: key + (suffix || ""), points, dashed};
}

function drawRunCharts(grid, run, other, otherName) {
  grid.innerHTML = "";
  const keys = new Set(run.metrics.flatMap((m) => Object.keys(m)));
  for (const [title, match] of CHARTS) {
    const chosen = [...keys].filter(match).sort();
    if (!chosen.length) continue;
    const series = chosen.map((k) => seriesOf(run.metrics, k));
    if (other) chosen.forEach((k) => series.push(seriesOf(other.metrics, k, ` (${otherName})`, true)));
    const figure = h("figure", {});
    grid.append(figure);
    drawChart(figure, series, {title, metric: chosen[0]});
  }
  const stages = STAGES.filter((s) => keys.has(`time/${s}_s`));
  if (stages.length) {
    const figure = h("figure", {});
    grid.append(figure);
    drawChart(figure, stages.map((s) => ({...seriesOf(run.metrics, `time/${s}_s`), name: s})),
      {title: "Seconds per stage (stacked)", metric: "time", stacked: true});
  }
  const sets = new Set(run.evals.flatMap((e) => Object.keys(e.sets || {})));
  for (const set of [...sets].sort()) {
    const ks = new Set(run.evals.flatMap((e) => Object.keys((e.sets || {})[set] || {})));
    const passKeys = [...ks].filter((k) => /^pass@\d+$/.test(k)).sort();
    const series = passKeys.map((k) => ({
      name: k, points: run.evals.filter((e) => e.sets && e.sets[set] && typeof e.sets[set][k] === "number")
        .map((e) => [e.step, e.sets[set][k]]),
    }));
    const figure = h("figure", {});
    grid.append(figure);
    drawChart(figure, series, {title: `Eval ${set}: pass@k`, metric: `eval/${set}`, xLabel: "step"});
  }
}

async function runPage(id) {
  const targets = (await api("/api/targets")).targets.filter((t) => t.kind === "run" && t.id !== id);
  let run = await api("/api/run", {id});
  let other = null, otherName = null;
  setCrumbs([["runs", "#/list"], [runLabel(id), null]]);
  showProblems(run.problems);
  main.innerHTML = "";
  const grid = h("div", {class: "charts", id: "charts"});
  const compare = h("select", {id: "compare", onchange: async () => {
    otherName = compare.value || null;
    other = otherName ? await api("/api/run", {id: otherName}) : null;
    drawRunCharts(grid, run, other, otherName);
  }}, h("option", {value: ""}, "—"), targets.map((t) => h("option", {value: t.id}, t.title)));
  const launches = run.launches || [];
  const last = launches.length ? launches[launches.length - 1] : null;
  main.append(
    h("h1", {}, id === "." ? run.folder : id),
    h("p", {class: "muted", id: "summary"}, `${run.metrics.length} rollouts logged, ${run.evals.length} evaluations, `,
      `${launches.length} launch(es)` + (last ? `: python train.py ${last.argv.join(" ")}` : "")),
    h("div", {class: "toolbar"}, h("label", {}, "compare with ", compare),
      h("span", {class: "muted"}, " drag on a chart to zoom, double-click to zoom out")),
    grid);
  drawRunCharts(grid, run, other, otherName);

  const rollouts = h("ul", {class: "rollouts", id: "rollouts"});
  const fillRollouts = () => {
    rollouts.innerHTML = "";
    for (const r of run.rollouts) {
      const m = run.metrics.find((x) => x.rollout_id === r.rollout_id) || {};
      rollouts.append(h("li", {}, h("a", {href: `${runHref(id)}/rollout/${enc(r.file)}`}, `rollout ${r.rollout_id}`),
        m["rollout/reward_mean"] !== undefined ? ` reward ${fmt(m["rollout/reward_mean"])}` : "",
        m["rollout/samples"] !== undefined ? `, ${m["rollout/samples"]} samples` : ""));
    }
    if (!run.rollouts.length) rollouts.append(h("li", {class: "muted"}, "no trajectories written (yet)"));
  };
  fillRollouts();
  main.append(h("h2", {}, "Rollouts"), rollouts);
  if (last) {
    const table = h("table", {class: "flags", id: "flags"});
    for (const [k, v] of Object.entries(last.flags || {}).sort()) {
      table.append(h("tr", {}, h("th", {}, `--${k.replace(/_/g, "-")}`), h("td", {}, JSON.stringify(v))));
    }
    main.append(h("h2", {}, "Flags ", h("span", {class: "muted"}, `(launch ${launches.length}, ${last.started || ""}; policy ${last.policy_dir || "?"})`)),
      h("details", {}, h("summary", {}, "every flag"), table));
  }
  // a run still writing: re-read its files every few seconds and redraw what changed
  const live = document.getElementById("live");
  pollTimer = setInterval(async () => {
    if (document.hidden) return;
    try {
      const fresh = await api("/api/run", {id});
      if (fresh.metrics.length !== run.metrics.length || fresh.evals.length !== run.evals.length
          || fresh.rollouts.length !== run.rollouts.length) {
        run = fresh;
        drawRunCharts(grid, run, other, otherName);
        fillRollouts();
        document.getElementById("summary").firstChild.textContent = `${run.metrics.length} rollouts logged, ${run.evals.length} evaluations, `;
      }
      showProblems(fresh.problems);
      live.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      live.textContent = `cannot update: ${err.message}`;
    }
  }, 3000);
}

// -- tables of episodes ------------------------------------------------------------------------

const COLUMNS = [
  ["line", "#"], ["group", "group"], ["sample", "sample"], ["task_id", "task"], ["reward", "reward"],
  ["status", "status"], ["turns", "turns"], ["tool_calls", "tool calls"], ["tool_errors", "tool errors"],
  ["length", "tokens"], ["weight_version", "version"], ["advantage", "advantage"],
];

async function tablePage(where, container) {
  container = container || main;
  const state = {status: "", error: "", q: "", min_reward: "", max_reward: "", sort: "line", desc: "0", offset: 0, limit: 50};
  const isRun = where.kind === "run";
  if (isRun) setCrumbs([["runs", "#/list"], [runLabel(where.id), runHref(where.id)], [where.file, null]]);
  container.innerHTML = "";
  const table = h("table", {class: "episodes", id: "episodes"});
  const status = h("select", {id: "f-status"});
  const error = h("select", {id: "f-error"});
  const text = h("input", {id: "f-text", type: "search", placeholder: "search text"});
  const low = h("input", {id: "f-min", type: "number", step: "any", placeholder: "min reward", class: "num"});
  const high = h("input", {id: "f-max", type: "number", step: "any", placeholder: "max reward", class: "num"});
  const info = h("span", {class: "muted", id: "count"});
  const prev = h("button", {onclick: () => { state.offset = Math.max(0, state.offset - state.limit); load(); }}, "‹ prev");
  const next = h("button", {onclick: () => { state.offset += state.limit; load(); }}, "next ›");
  const filters = h("div", {class: "toolbar"}, status, error, low, high, text, prev, next, info);
  if (isRun) container.append(h("h1", {}, where.file));
  container.append(filters, table);
  const apply = () => {
    Object.assign(state, {status: status.value, error: error.value, q: text.value, min_reward: low.value, max_reward: high.value, offset: 0});
    load();
  };
  for (const el of [status, error, low, high]) el.addEventListener("change", apply);
  text.addEventListener("input", apply);
  let seq = 0;
  async function load() {
    const mine = ++seq;
    const params = {id: where.id, ...state};
    if (isRun) params.file = where.file;
    const page = await api("/api/rows", params);
    if (mine !== seq) return;  // a newer request is on its way
    fillSelect(status, page.statuses, "any status", state.status);
    fillSelect(error, page.error_kinds, "any tool error", state.error);
    info.textContent = `${page.matched} of ${page.total} episodes` + (page.matched > state.limit ? `, ${state.offset + 1}–${Math.min(page.matched, state.offset + state.limit)}` : "");
    prev.disabled = state.offset === 0;
    next.disabled = state.offset + state.limit >= page.matched;
    table.innerHTML = "";
    const head = h("tr", {});
    for (const [key, label] of COLUMNS) {
      const arrow = state.sort === key ? (state.desc === "1" ? " ▾" : " ▴") : "";
      head.append(h("th", {class: "sortable", dataset: {key}, onclick: () => {
        state.desc = state.sort === key && state.desc === "0" ? "1" : "0";
        state.sort = key; load();
      }}, label + arrow));
    }
    table.append(h("thead", {}, head));
    const body = h("tbody", {});
    for (const r of page.rows) body.append(rowOf(r, where));
    table.append(body);
  }
  await load();
}

function fillSelect(select, values, anyLabel, chosen) {
  const wanted = [""].concat(values);
  if (select.options.length && [...select.options].map((o) => o.value).join("|") === wanted.join("|")) return;
  select.innerHTML = "";
  for (const v of wanted) select.append(h("option", {value: v, selected: v === chosen}, v || anyLabel));
}

function rowOf(r, where) {
  const href = where.kind === "run" ? `${runHref(where.id)}/sample/${enc(where.file)}/${r.line}` : `${evalHref(where.id)}/sample/${r.line}`;
  if (r.status === "malformed") {
    return h("tr", {class: "malformed"}, h("td", {}, r.line), h("td", {colspan: COLUMNS.length - 1}, `malformed line: ${r.error}`));
  }
  const errors = Object.entries(r.tool_errors || {}).map(([k, v]) => `${k}×${v}`).join(" ");
  const groupCell = where.kind === "run"
    ? h("a", {href: `${runHref(where.id)}/rollout/${enc(where.file)}/group/${enc(r.group)}`, title: "the group side by side"}, r.group)
    : r.group;
  return h("tr", {class: `status-${r.status}`, dataset: {status: r.status, line: r.line}},
    h("td", {}, h("a", {href, class: "open"}, r.line)), h("td", {}, groupCell), h("td", {}, r.sample),
    h("td", {class: "task"}, r.task_id || ""), h("td", {}, fmt(r.reward)), h("td", {}, h("span", {class: `badge ${r.status}`}, r.status)),
    h("td", {}, r.turns), h("td", {}, r.tool_calls), h("td", {}, errors), h("td", {}, r.length), h("td", {}, r.weight_version ?? ""),
    h("td", {}, r.advantage === undefined ? "" : fmt(r.advantage)));
}

async function groupPage(id, file, group) {
  setCrumbs([["runs", "#/list"], [runLabel(id), runHref(id)], [file, `${runHref(id)}/rollout/${enc(file)}`], [`group ${group}`, null]]);
  const page = await api("/api/rows", {id, file, group, limit: 1000, sort: "sample"});
  main.innerHTML = "";
  main.append(h("h1", {}, `Group ${group}`), h("p", {class: "muted"},
    "Advantages are GRPO's (reward − group mean) / (std + 1e-6), as the trainer computes them from these rewards; other estimators show none."));
  const cards = h("div", {class: "group", id: "group"});
  for (const r of page.rows) {
    cards.append(h("a", {class: `card status-${r.status}`, href: `${runHref(id)}/sample/${enc(file)}/${r.line}`},
      h("div", {class: "big"}, `sample ${r.sample}`),
      h("div", {}, "reward ", h("b", {}, fmt(r.reward))),
      h("div", {class: "advantage"}, "advantage ", h("b", {}, r.advantage === undefined ? "–" : fmt(r.advantage))),
      h("div", {}, h("span", {class: `badge ${r.status}`}, r.status), ` ${r.finish || ""}`),
      h("div", {}, `${r.turns} turns, ${r.tool_calls} tool calls, ${r.length} tokens`)));
  }
  main.append(cards);
}

// -- an evaluation -----------------------------------------------------------------------------

async function evalPage(id) {
  const data = await api("/api/eval", {id});
  setCrumbs([["runs", "#/list"], [id, null]]);
  showProblems(data.problems);
  main.innerHTML = "";
  const s = data.summary || {};
  main.append(h("h1", {}, id), h("p", {class: "muted"}, `policy ${s.policy || "?"}, env ${s.env || "?"}, split ${s.split || "?"}, ${data.episodes} episodes`));
  const table = h("table", {class: "sets", id: "sets"});
  table.append(h("tr", {}, ["set", "prompts", "samples", "pass@k", "mean reward", "failed", "errors"].map((c) => h("th", {}, c))));
  for (const [name, m] of Object.entries(s.sets || {})) {
    const pass = Object.entries(m).filter(([k]) => /^pass@\d+$/.test(k)).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
    table.append(h("tr", {}, h("td", {}, name), h("td", {}, m.n_prompts), h("td", {}, m.n_samples), h("td", {class: "pass"}, pass),
      h("td", {}, fmt(m.mean_reward)), h("td", {}, m.failed), h("td", {}, JSON.stringify(m.errors || {}))));
  }
  main.append(table);
  const holder = h("div", {});
  main.append(h("h2", {}, "Episodes"), holder);
  await tablePage({kind: "eval", id}, holder);
}

// -- one episode -------------------------------------------------------------------------------

function logprobColor(lp) {  // 0 (certain) white-ish green, very negative deep red
  const t = Math.max(0, Math.min(1, -lp / 8));
  const hue = 120 * (1 - t);
  return `hsl(${hue}, 70%, ${88 - 30 * t}%)`;
}

async function episodePage(where) {
  const params = {id: where.id, line: where.line};
  if (where.file) params.file = where.file;
  const e = await api("/api/sample", params);
  const back = where.kind === "run" ? [[runLabel(where.id), runHref(where.id)], [where.file, `${runHref(where.id)}/rollout/${enc(where.file)}`]]
    : [[where.id, evalHref(where.id)]];
  setCrumbs([["runs", "#/list"], ...back, [`line ${where.line}`, null]]);
  main.innerHTML = "";
  const hd = e.header;
  main.append(h("h1", {}, `Episode: group ${hd.group}, sample ${hd.sample}`),
    h("div", {class: "facts", id: "facts"},
      fact("task", hd.task_id), fact("reward", fmt(hd.reward)), fact("status", h("span", {class: `badge ${hd.status}`}, hd.status)),
      fact("finish", hd.finish), fact("turns", hd.turns), fact("weight version", hd.weight_version ?? "–"),
      hd.weight_versions ? fact("versions", hd.weight_versions.join(" → ")) : null,
      fact("seconds", hd.episode_s ? fmt(hd.episode_s) : "–"),
      fact("tool errors", Object.entries(hd.tool_errors || {}).map(([k, v]) => `${k}×${v}`).join(" ") || "none"),
      hd.restarted ? fact("restarted", String(hd.restarted)) : null,
      hd.gateway ? fact("gateway", `${hd.gateway.segments} segment(s), ${hd.gateway.rewrites} rewrite(s), ${hd.gateway.dropped_replies} of ${hd.gateway.replies} replies dropped`) : null,
      h("span", {class: "muted"}, `${e.where.file} line ${e.where.line}`)));
  if (hd.error) main.append(h("div", {class: "error"}, hd.error, hd.traceback ? h("pre", {}, hd.traceback) : null));
  const columns = h("div", {class: "columns"});
  columns.append(h("section", {class: "conversation", id: "conversation"}, h("h2", {}, "Conversation"), conversation(e)));
  columns.append(h("section", {class: "tokens-pane"}, h("h2", {}, "Tokens"), tokenView(e)));
  main.append(columns);
  if (e.turns.length) main.append(h("h2", {}, "Turns"), turnTable(e.turns));
  main.append(h("h2", {}, "Grader"), e.grade === null || e.grade === undefined
    ? h("p", {class: "muted", id: "grade"}, "the env recorded no grade for this episode")
    : h("div", {}, h("p", {class: "muted", id: "grade-note"},
        "the grader's findings, after the episode: they may hold the task's private fields " +
        "(answers, hidden tests), which the policy never saw"),
      h("pre", {class: "grade", id: "grade"}, JSON.stringify(e.grade, null, 2))));
  main.append(h("h2", {}, "Sandbox commands"), commandTable(e.commands));
}

function fact(label, value) {
  return h("span", {class: "fact"}, h("small", {}, label), value ?? "–");
}

function conversation(e) {
  const box = h("div", {class: "bubbles"});
  const cut = new Map((e.cut_messages || []).map((c) => [c.message, c]));
  e.messages.forEach((m, i) => {
    const role = m.role || "?";
    const bubble = h("div", {class: `bubble ${role}`, dataset: {index: i}}, h("div", {class: "role"}, role + (m.name ? ` · ${m.name}` : "")));
    if (m.content) bubble.append(h("div", {class: "content"}, String(m.content)));
    for (const call of m.tool_calls || []) {
      bubble.append(h("div", {class: "call"}, h("b", {}, `→ ${call.name}`), h("pre", {}, JSON.stringify(call.arguments, null, 2))));
    }
    const c = cut.get(i);
    if (c) bubble.append(h("div", {class: "cut"}, `cut to fit the context: the model saw ${c.shown_chars} of ${c.original_chars} characters`));
    box.append(bubble);
  });
  if (!e.messages.length) box.append(h("p", {class: "muted"}, "no conversation recorded"));
  return box;
}

function tokenView(e) {
  const t = e.tokens;
  if (!t) return h("p", {class: "muted", id: "tokens"}, "no tokens: a scripted policy played this episode");
  const wrap = h("div", {});
  wrap.append(h("div", {class: "legend tokens-legend"},
    h("span", {class: "tok prompt"}, "prompt"), h("span", {class: "tok masked"}, "environment (loss mask 0)"),
    h("span", {class: "tok", style: `background:${logprobColor(-0.05)}`}, "trained, likely"),
    h("span", {class: "tok", style: `background:${logprobColor(-6)}`}, "trained, unlikely"),
    h("span", {class: "muted"}, " hover a token for its id position, log-prob and weight version")));
  if (t.note) wrap.append(h("p", {class: "problem"}, t.note));
  const box = h("div", {class: "tokens", id: "tokens"});
  const starts = new Set(t.turn_starts);
  const frag = document.createDocumentFragment();
  t.pieces.forEach((piece, i) => {
    const r = i - t.prompt_length;
    if (r >= 0 && starts.has(r)) frag.appendChild(h("span", {class: "turn-mark", title: `turn starts at response token ${r}`}, "▍"));
    const span = document.createElement("span");
    span.textContent = piece;
    if (r < 0) {
      span.className = "tok prompt";
      span.title = `prompt token ${i}`;
    } else {
      const mask = t.mask[r], lp = t.logprobs[r], v = t.versions.length ? t.versions[r] : null;
      span.className = mask ? "tok trained" : "tok masked";
      span.dataset.mask = mask;
      if (mask) span.style.background = logprobColor(lp);
      span.title = `response token ${r}, mask ${mask}` + (mask ? `, log-prob ${fmt(lp)}` : "") + (v !== null && v >= 0 ? `, weight version ${v}` : "");
    }
    frag.appendChild(span);
  });
  box.appendChild(frag);
  wrap.append(box);
  return wrap;
}

function turnTable(turns) {
  const table = h("table", {class: "turns", id: "turns"});
  table.append(h("tr", {}, ["#", "role", "tokens", "tools", "finish", "generate s", "tools s", "grade s"].map((c) => h("th", {}, c))));
  turns.forEach((t, i) => table.append(h("tr", {}, h("td", {}, i), h("td", {}, t.role), h("td", {}, `${t.start}–${t.end}`),
    h("td", {}, (t.tool_names || []).join(", ")), h("td", {}, t.finish_reason || ""), h("td", {}, fmt(t.generate_s)),
    h("td", {}, fmt(t.tools_s)), h("td", {}, fmt(t.reward_s)))));
  return table;
}

function commandCell(command) {  // a long command (a grader's inline script) folds to its first line
  const text = String(command || "");
  if (text.length <= 160 && !text.includes("\n")) return h("code", {}, text);
  return h("details", {}, h("summary", {}, h("code", {}, text.split("\n")[0].slice(0, 120) + " …")), h("pre", {}, text));
}

function commandTable(commands) {
  if (!commands || !commands.length) return h("p", {class: "muted", id: "commands"}, "no sandbox commands recorded");
  const table = h("table", {class: "commands", id: "commands"});
  table.append(h("tr", {}, ["phase", "turn", "kind", "command", "exit", "seconds", "output"].map((c) => h("th", {}, c))));
  for (const c of commands) {
    if (c.kind === "dropped") { table.append(h("tr", {}, h("td", {colspan: 7, class: "muted"}, `${c.count} more not recorded`))); continue; }
    const status = c.timed_out ? "timeout" : c.limit_hit ? c.limit_hit : c.exit_code ?? (c.bytes !== undefined ? `${c.bytes} B` : "");
    table.append(h("tr", {class: c.exit_code ? "failed" : ""}, h("td", {}, c.phase), h("td", {}, c.turn), h("td", {}, c.kind),
      h("td", {}, commandCell(c.command)), h("td", {}, status), h("td", {}, fmt(c.duration_s)),
      h("td", {}, c.output ? h("details", {}, h("summary", {}, `${c.output_chars} chars`), h("pre", {}, c.output)) : "")));
  }
  return table;
}

route();
