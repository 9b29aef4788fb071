// upsguard's live page: follows the service's server-sent events and draws the status.
// Plain JavaScript, no library, nothing fetched from outside this page. Text from the
// service goes into the page as text (textContent), never as HTML.
"use strict";

const page = document.body.dataset.page;
const csrf = document.querySelector('meta[name="csrf-token"]').content;
let status = null;
let heardAt = null; // when the last message arrived (this browser's clock)
let lostSince = null; // when the stream broke, while it is broken
let source = null;
let plans = null; // the site's plans between runs (GET /api/plan)
const ended = {}; // per direction, the last run seen here, as it ended
let renders = 0;

// -- formatting -------------------------------------------------------------------------

function dur(s) {
  if (s === null || s === undefined) return "–";
  const neg = s < 0;
  s = Math.round(Math.abs(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  const text = h ? `${h}h ${m}m` : m ? (sec ? `${m}m ${sec}s` : `${m}m`) : `${sec}s`;
  return neg ? `-${text}` : text;
}
function pct(v) { return v === null || v === undefined ? "–" : `${Math.round(v)} %`; }
function bytes(v) {
  if (v === null || v === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}
function clock(iso) { return iso ? new Date(iso).toLocaleTimeString() : "–"; }
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.dataset[k.slice(5)] = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c === null || c === undefined ? "" : c);
  return node;
}
function badge(state, text) { return el("span", { class: "state", "data-state": state }, text || state); }
function fill(id, rows) {
  const body = document.querySelector(`#${id} tbody`) || document.getElementById(id);
  if (body) body.replaceChildren(...rows);
}

// -- the stream -------------------------------------------------------------------------

function connect() {
  source = new EventSource("/api/stream");
  source.addEventListener("status", (e) => {
    heardAt = Date.now();
    lostSince = null;
    status = JSON.parse(e.data);
    draw();
  });
  source.addEventListener("journal", (e) => { if (page === "events") addEvent(JSON.parse(e.data)); });
  source.addEventListener("resync", () => { if (page === "events") loadEvents(); });
  source.onerror = () => {
    if (lostSince === null) lostSince = Date.now();
    showLink();
    if (source.readyState === EventSource.CLOSED) { // the server refused: logged out, or gone
      source.close();
      fetch("/api/status", { credentials: "same-origin" }).then((r) => {
        if (r.status === 401) location.href = `/login?next=${encodeURIComponent(location.pathname)}`;
      }).catch(() => {});
      setTimeout(connect, 3000);
    }
  };
}

function showLink() {
  const link = document.getElementById("link");
  const banner = document.getElementById("banner");
  if (lostSince !== null) {
    link.dataset.state = "lost";
    link.textContent = "service unreachable";
    banner.hidden = false;
    banner.textContent = `The service is unreachable since ${new Date(lostSince).toLocaleTimeString()}`
      + (heardAt ? `: what you see is ${dur((Date.now() - heardAt) / 1000)} old` : "")
      + ". Reconnecting…";
    return;
  }
  banner.hidden = true;
  if (heardAt === null) return;
  const age = (Date.now() - heardAt) / 1000;
  link.dataset.state = age > 20 ? "lost" : "live";
  link.textContent = `live · data ${dur(age)} old`;
}

// -- drawing ----------------------------------------------------------------------------

function draw() {
  renders += 1;
  document.body.dataset.renders = String(renders);
  const phase = document.getElementById("phase");
  phase.dataset.phase = status.phase;
  phase.textContent = status.phase.replace("_", " ");
  const held = document.getElementById("held");
  held.hidden = !status.held;
  if (status.held) held.textContent = `HOLD${status.held.who ? ` by ${status.held.who}` : ""}: ${status.held.reason}`;
  showLink();
  if (page === "overview") drawOverview();
  else if (page === "plan") drawPlans();
  else if (page === "caches") drawCaches();
}

function drawOverview() {
  const c = status.countdown;
  const set = (id, text, bad) => {
    const node = document.getElementById(id);
    node.textContent = text;
    node.classList.toggle("bad", Boolean(bad));
  };
  set("runtime-left", c && c.on_battery ? dur(c.runtime_left_s) : "on mains");
  set("plan-left", c ? dur(c.plan_left_s) : "–");
  set("margin", c ? dur(c.margin_s) : "–");
  set("spare", c && c.spare_s !== null ? dur(c.spare_s) : "–", c && c.spare_s !== null && c.spare_s < 0);
  fill("triggers", (c ? c.triggers : []).map((t) => el("li", {},
    badge(t.holds ? "failed" : "waiting", t.holds ? "holds" : "waits"), ` ${t.condition} (${t.feed})`,
    t.holds ? "" : ` fires in ${t.fires_in_s === null ? "?" : dur(Math.max(0, t.fires_in_s))}`)));
  fill("ups", status.ups.map(upsCard));
  fill("feeds", status.feeds.map((f) => el("tr", { "data-feed": f.name },
    el("td", {}, f.name), el("td", {}, badge(f.state)),
    el("td", {}, `${f.online} / ${f.needed}`), el("td", {}, dur(f.runtime_s)),
    el("td", {}, Object.entries(f.members).map(([u, w]) => `${u}: ${w}`).join(", ")))));
  drawRun();
  drawPair();
  fill("alerts", status.alerts.length
    ? status.alerts.map((a) => el("li", {}, badge("error", "alert"), ` ${a.text}`))
    : [el("li", {}, "none")]);
}

// Each controller's reading of each UPS, this one's and what the other published: two
// readings that disagree are shown side by side; a view that is missing or old says so.
function drawPair() {
  const ha = status.ha;
  document.getElementById("pair").hidden = !ha;
  if (!ha) return;
  const role = ha.role.replace("_", " ");
  document.getElementById("pair-role").textContent = ha.role === "leader"
    ? `${ha.me} leads${ha.token === null ? "" : ` (term ${ha.token})`}`
    : `${ha.me} is ${role}; ${ha.leader || "nobody"} leads`;
  const words = {};
  status.feeds.forEach((f) => Object.assign(words, f.members));
  const row = (who, u, word, why) => el("tr", { "data-controller": who, "data-ups": u.name },
    el("td", {}, who), el("td", {}, u.name), el("td", {}, badge(word)),
    el("td", {}, pct(u.charge_pct)), el("td", {}, dur(u.runtime_s)), el("td", {}, why || ""));
  const rows = status.ups.map((u) => row(`${ha.me} (this one)`, u, words[u.name] || "unread", u.error));
  const missing = (why) => el("tr", { "data-controller": "other" },
    el("td", {}, "the other controller"), el("td", {}, "–"), el("td", {}, badge("unknown")),
    el("td", {}, "–"), el("td", {}, "–"), el("td", {}, why));
  if (ha.others_age_s === null) rows.push(missing("not exchanged yet: etcd has not answered"));
  else if (!ha.others.length) rows.push(missing("publishes no readings: stopped, or cut off from etcd"));
  const old = ha.others_age_s !== null && ha.others_age_s > ha.lease_ttl_s;
  ha.others.forEach((v) => v.ups.forEach((u) => rows.push(row(`${v.name} (${v.role.replace("_", " ")})`, u,
    old ? "stale" : u.word, old ? `exchanged ${dur(ha.others_age_s)} ago, etcd silent since` : u.why))));
  fill("pair-readings", rows);
}

function upsCard(u) {
  const link = u.link || "unknown";
  const age = u.at ? (new Date(status.at) - new Date(u.at)) / 1000 + (Date.now() - heardAt) / 1000 : null;
  const charge = u.charge_pct === null ? 0 : u.charge_pct;
  return el("div", { class: "card", "data-ups": u.name },
    el("h3", {}, u.name, badge(link === "ok" ? (u.on_battery ? "warning" : "ok") : link,
      link === "ok" ? (u.status || "–") : link)),
    meter(charge),
    el("dl", {},
      el("dt", {}, "charge"), el("dd", {}, pct(u.charge_pct)),
      el("dt", {}, "runtime"), el("dd", { class: "runtime" }, dur(u.runtime_s)),
      el("dt", {}, "load"), el("dd", {}, pct(u.load_pct)),
      el("dt", {}, "data age"), el("dd", { class: "age" }, age === null ? "never read" : dur(age)),
      ...(u.error ? [el("dt", {}, "error"), el("dd", {}, u.error)] : [])));
}

function meter(charge) {
  const bar = el("span", {});
  bar.style.width = `${Math.max(0, Math.min(100, charge))}%`; // CSSOM: allowed by the page's CSP
  return el("div", { class: `meter${charge < 30 ? " low" : ""}` }, bar);
}

function drawRun() {
  const box = document.getElementById("run");
  const run = status.run;
  if (!run) {
    const last = status.last_run;
    box.replaceChildren(el("p", {}, last
      ? `No run in progress. Last: ${last.kind} run ${last.id}, ${last.state}.`
      : "No run in progress, and none yet."));
    return;
  }
  const running = run.running.map((s) => el("li", {}, badge("running"), ` ${s.step}: ${s.description}` +
    (s.under_way_since ? ` (under way since ${new Date(s.under_way_since).toLocaleTimeString()}, started before the restart)` : "")));
  box.replaceChildren(
    el("p", { id: "run-summary" }, `${run.kind} run ${run.id} (${run.origin}): `
      + `${run.finished}/${run.total} steps finished, ${dur(run.elapsed_s)} elapsed of about `
      + `${dur(run.plan.estimate_s)}${run.failed.length ? `, ${run.failed.length} failed` : ""}`
      + (run.point_of_no_return ? `; past the point of no return (${run.point_of_no_return})` : "")),
    el("ul", { class: "plain" }, ...running));
}

function stepRow(step, index) {
  const row = el("tr", { "data-step": step.id, "data-state": step.state },
    el("td", {}, String(index + 1)), el("td", {}, badge(step.state, step.state.replace("_", " "))),
    el("td", {}, step.id), el("td", {}, step.description + (step.detail ? ` — ${step.detail}` : "")),
    el("td", {}, `${step.elapsed_s === null ? "–" : dur(step.elapsed_s)} / ${dur(step.estimate_s)}`),
    el("td", {}, (step.critical ? "★" : "") + (step.point_of_no_return ? "⚑" : "")));
  if (step.critical) row.classList.add("critical");
  return row;
}

function drawPlans() {
  for (const direction of ["shutdown", "startup"]) {
    const live = status.run && status.run.direction === direction ? status.run.plan : null;
    if (live) ended[direction] = { id: status.run.id, plan: live, final: false };
    const last = live ? null : ended[direction];
    if (last && !last.final) {
      last.final = true; // the run is over: its steps as the journal ended them
      fetch(`/api/runs/${encodeURIComponent(last.id)}/plan`, { credentials: "same-origin" })
        .then((r) => (r.ok ? r.json() : null))
        .then((p) => { if (p) { last.plan = p; drawPlans(); } });
    }
    const plan = live || (last && last.plan) || (plans && plans[direction]);
    if (!plan) continue;
    fill(`plan-${direction}`, plan.steps.map(stepRow));
    const ponr = plan.steps.find((s) => s.point_of_no_return);
    const state = live
      ? `run ${status.run.id} in progress, ${dur(status.run.elapsed_s)} elapsed, about ${dur(status.run.left_s)} left. `
      : last ? `run ${last.id} ended (as last seen here). ` : "not running. ";
    document.getElementById(`summary-${direction}`).textContent = state
      + `Estimate ${dur(plan.estimate_s)}, critical path ${dur(plan.critical_path_s)}`
      + (ponr ? `; point of no return at ${ponr.id}` : "") + ".";
  }
}

// A cache that was not read is unknown, never ok: its mode and cleanliness say so.
function cacheMode(c) {
  if (c.mode === null) return badge(c.error ? "error" : "unknown", c.error ? "unread" : "?");
  return badge(c.mode === "write-back" ? "warning" : "ok", c.mode);
}
function cacheClean(c) {
  if (c.clean === true) return "clean";
  if (c.clean === null) return c.error ? `unread: ${c.error}` : "not read yet";
  return dur(c.eta_s);
}
function drawCaches() {
  fill("caches", status.caches.map((c) => el("tr", { "data-cache": `${c.cache}/${c.target}` },
    el("td", {}, c.cache), el("td", {}, c.target),
    el("td", {}, cacheMode(c)),
    el("td", {}, bytes(c.dirty_bytes)),
    el("td", {}, c.rate_bps === null ? "–" : `${bytes(c.rate_bps)}/s`),
    el("td", {}, cacheClean(c)),
    el("td", {}, c.gates.join(", ") || "–"))));
}

// -- events -----------------------------------------------------------------------------

function eventRow(e) {
  return el("tr", { "data-event": String(e.id) },
    el("td", {}, clock(e.at)), el("td", {}, badge(e.level)), el("td", {}, e.kind), el("td", {}, e.text));
}
function filters() { return new FormData(document.getElementById("filters")); }
function matches(e) {
  const f = filters();
  const words = (f.get("q") || "").toLowerCase();
  return (!f.get("level") || e.level === f.get("level")) && (!f.get("kind") || e.kind === f.get("kind"))
    && (!f.get("run") || e.run === f.get("run")) && (!words || e.text.toLowerCase().includes(words));
}
function addEvent(e) {
  const body = document.querySelector("#events tbody");
  if (matches(e)) body.prepend(eventRow(e));
}
function loadEvents() {
  const query = new URLSearchParams(filters()).toString();
  fetch(`/api/events?${query}`, { credentials: "same-origin" }).then((r) => r.json()).then((data) => {
    fill("events", data.events.slice().reverse().map(eventRow));
    const kind = document.querySelector('#filters select[name="kind"]');
    const chosen = kind.value;
    kind.replaceChildren(el("option", { value: "" }, "any"), ...data.kinds.map((k) => el("option", {}, k)));
    kind.value = chosen;
  });
}

// -- controls ---------------------------------------------------------------------------

const WHAT = {
  hold: "Hold: automatic runbooks wait (down to the critical floor).",
  release: "Release the hold: automatic runbooks go on.",
  trigger: "Start the runbook now.",
  abort: "Cancel the run in progress, and hold.",
};

function openControl(button) {
  const dialog = document.getElementById("confirm");
  const act = button.dataset.act, direction = button.dataset.direction || "";
  dialog.dataset.act = act;
  dialog.dataset.direction = direction;
  document.getElementById("confirm-title").textContent = button.textContent;
  document.getElementById("confirm-what").textContent = WHAT[act];
  document.getElementById("confirm-only-label").hidden = act !== "trigger";
  for (const id of ["confirm-only", "confirm-reason"]) document.getElementById(id).value = "";
  document.getElementById("confirm-sure").checked = false;
  document.getElementById("confirm-error").textContent = "";
  dialog.showModal();
}

function sendControl() {
  const dialog = document.getElementById("confirm");
  const reason = document.getElementById("confirm-reason").value.trim();
  const error = document.getElementById("confirm-error");
  if (!reason) { error.textContent = "Give a reason: it is journaled with your name."; return; }
  if (!document.getElementById("confirm-sure").checked) { error.textContent = "Tick 'I am sure' first."; return; }
  const body = { reason, confirm: true };
  if (dialog.dataset.act === "trigger") {
    body.direction = dialog.dataset.direction;
    body.only = document.getElementById("confirm-only").value.split(/\s+/).filter(Boolean);
  }
  fetch(`/api/${dialog.dataset.act}`, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
    body: JSON.stringify(body),
  }).then(async (r) => {
    const text = await r.text();
    let answer = {};
    try { answer = JSON.parse(text); } catch (_) { answer = { error: text }; }
    if (!r.ok) { error.textContent = answer.error || `refused (${r.status})`; return; }
    dialog.close();
    document.getElementById("control-result").textContent = `${dialog.dataset.act}: done (${JSON.stringify(answer)})`;
  }).catch(() => { error.textContent = "the service did not answer"; });
}

// -- start ------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  connect();
  setInterval(showLink, 1000);
  if (page === "plan") {
    fetch("/api/plan", { credentials: "same-origin" }).then((r) => r.json()).then((p) => {
      plans = p;
      if (status) drawPlans();
    });
  }
  if (page === "events") {
    loadEvents();
    document.getElementById("filters").addEventListener("input", loadEvents);
    document.getElementById("filters").addEventListener("submit", (e) => e.preventDefault());
  }
  for (const button of document.querySelectorAll("#controls button[data-act]")) {
    button.addEventListener("click", () => openControl(button));
  }
  const go = document.getElementById("confirm-go");
  if (go) go.addEventListener("click", sendControl);
  const logout = document.getElementById("logout");
  if (logout) {
    logout.addEventListener("click", () => {
      fetch("/logout", { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": csrf } })
        .then(() => { location.href = "/login"; });
    });
  }
  for (const t of document.querySelectorAll("time[datetime]")) t.textContent = new Date(t.dateTime).toLocaleString();
});
