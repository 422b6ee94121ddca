// The queue page: the jobs table, kept current by server-sent events (/api/events), and the actions
// of the JSON API. Plain JavaScript, no build step, nothing fetched from elsewhere.
"use strict";

const jobs = new Map();           // id -> job (as /api/jobs lists it)
let paused = false;
let selected = null;

const $ = (sel) => document.querySelector(sel);

async function call(method, url, body) {
  const res = await fetch(url, {method, headers: body ? {"Content-Type": "application/json"} : {},
                                body: body ? JSON.stringify(body) : undefined, credentials: "same-origin"});
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw Object.assign(new Error(data.error || res.statusText), {data, status: res.status});
  return data;
}

function live(job) {
  // A running job whose lease has expired has lost its worker: it will be taken back (re-queued).
  if (job.state === "running" && job.lease_expires && job.lease_expires * 1000 < Date.now()) return "re-queued";
  return job.state;
}

function fmtEta(s) {
  if (s == null) return "";
  s = Math.round(s);
  return s >= 60 ? `${Math.floor(s / 60)}m ${s % 60}s` : `${s}s`;
}

const esc = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

// Which actions a job in each state offers (the buttons of its row).
function actions(job) {
  const out = [];
  if (["queued", "waiting-on-deps", "paused", "running"].includes(job.state)) out.push("cancel");
  if (["queued", "waiting-on-deps", "running"].includes(job.state)) out.push("pause");
  if (job.state === "paused") out.push("resume");
  if (["failed", "canceled", "blocked-by-guard"].includes(job.state)) out.push("retry");
  if (["queued", "waiting-on-deps", "paused"].includes(job.state)) out.push("up", "down");
  return out;
}

// One row as HTML (the table is drawn as one string: a redraw of 1,000 jobs stays in milliseconds).
function row(job) {
  const state = live(job);
  const p = job.progress || {};
  const frac = job.state === "succeeded" ? 1 : (p.total ? p.step / p.total : 0);
  const stage = p.stage ? `${p.stage} ${p.step ?? 0}/${p.total ?? "?"}` : "";
  // A render in progress shows its latest preview (the denoised estimate, then the first decoded
  // frames; `preview` is the image's version); a finished still shows itself.
  const thumb = job.preview ? `<img class="thumb preview" src="/api/jobs/${job.id}/preview?v=${job.preview}">`
    : job.kind !== "stitch" && job.state === "succeeded" && /\.(png)$/.test(job.output || "")
    ? `<img class="thumb" src="/api/jobs/${job.id}/preview">` : "";
  const buttons = actions(job).map((a) => `<button type="button" data-action="${a}">${a}</button>`).join("");
  return `<tr class="state-${esc(job.state)}${job.id === selected ? " selected" : ""}" data-id="${job.id}">
    <td>${job.id}</td><td class="name">${esc(job.name || job.kind)}</td><td class="state">${esc(state)}</td>
    <td><span class="bar"><span style="width:${Math.round(frac * 100)}%"></span></span> <span class="muted">${esc(stage)}</span></td>
    <td>${fmtEta(job.eta_s)}</td><td>${job.attempts}/${job.max_attempts}</td><td>${job.priority}</td><td>${thumb}</td>
    <td class="actions">${buttons}</td></tr>`;
}

function act(job, action) {
  if (action === "up" || action === "down") {
    return call("PATCH", `/api/jobs/${job.id}`, {priority: job.priority + (action === "up" ? 1 : -1)});
  }
  return call("POST", `/api/jobs/${job.id}/${action}`);
}

// One listener for the whole table: a button runs its action, a click elsewhere on a row selects it.
$("#jobs tbody").addEventListener("click", (e) => {
  const tr = e.target.closest("tr[data-id]");
  if (!tr) return;
  const job = jobs.get(Number(tr.dataset.id));
  const button = e.target.closest("button[data-action]");
  if (button) act(job, button.dataset.action).catch(showError);
  else select(job.id);
});

function render() {
  const html = [];
  const groups = new Map();
  for (const job of [...jobs.values()].sort((a, b) => a.id - b.id)) {
    const key = job.group || "";
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(job);
  }
  for (const [group, members] of groups) {
    if (group) html.push(`<tr class="group"><td colspan="9">${esc(group)}</td></tr>`);
    // Shots first (by priority, then order), then the steps that wait on them.
    members.sort((a, b) => (a.kind !== "render") - (b.kind !== "render") || b.priority - a.priority || a.id - b.id);
    for (const job of members) html.push(row(job));
  }
  $("#jobs tbody").innerHTML = html.join("");
  $("#queue-state").textContent = paused ? "queue paused" : "queue running";
  $("#queue-toggle").textContent = paused ? "Resume queue" : "Pause queue";
}

// Events can come in bursts (a workflow of many shots): draw at most once per animation frame.
let drawing = false;
function redraw() {
  if (drawing) return;
  drawing = true;
  requestAnimationFrame(() => { drawing = false; render(); });
}

async function select(id) {
  selected = id;
  render();
  const job = jobs.get(id);
  $("#detail").hidden = false;
  $("#detail-title").textContent = `#${id} ${job.name || job.kind} — ${live(job)}`;
  const media = $("#detail-media");
  media.replaceChildren();
  if (job.state === "succeeded" && job.output) {
    const el = document.createElement(/\.(mp4|webm|mkv|mov)$/.test(job.output) ? "video" : "img");
    el.src = `/api/jobs/${id}/preview`;
    if (el.tagName === "VIDEO") { el.controls = true; el.loop = true; el.muted = true; el.id = "player"; }
    media.appendChild(el);
  } else if (job.preview) {
    const img = document.createElement("img");
    img.className = "preview"; img.id = "detail-preview";
    img.src = `/api/jobs/${id}/preview?v=${job.preview}`;
    img.onerror = () => img.remove();
    media.appendChild(img);
  }
  const logs = await call("GET", `/api/jobs/${id}/logs`).catch(() => ({logs: []}));
  $("#detail-logs").textContent = logs.logs.map((l) => `[${l.attempt}] ${l.text}`).join("\n") || "(no log)";
}

function showError(e) {
  const problems = e.data && e.data.problems ? "\n" + e.data.problems.join("\n") : "";
  $("#submit-result").textContent = `${e.status || ""} ${e.message}${problems}`;
}

async function refresh() {
  const data = await call("GET", "/api/jobs");
  jobs.clear();
  for (const job of data.jobs) jobs.set(job.id, job);
  paused = data.paused;
  render();
}

function listen() {
  const source = new EventSource("/api/events");
  // Changes after this point come as events; the list is read once the stream is open, so none is missed.
  source.onopen = () => { $("#connection").textContent = "live"; refresh().catch(showError); };
  source.onerror = () => { $("#connection").textContent = "reconnecting…"; };
  source.addEventListener("job", (e) => {
    const job = JSON.parse(e.data);
    jobs.set(job.id, job);
    redraw();
    if (job.id === selected && job.state !== "running") select(job.id);
    else if (job.id === selected && job.preview) {
      const img = $("#detail-preview");
      if (img) img.src = `/api/jobs/${job.id}/preview?v=${job.preview}`; else select(job.id);
    }
  });
  source.addEventListener("removed", (e) => { jobs.delete(JSON.parse(e.data).id); redraw(); });
  source.addEventListener("queue", (e) => { paused = JSON.parse(e.data).paused; redraw(); });
}

$("#queue-toggle").addEventListener("click", () => call("POST", `/api/queue/${paused ? "resume" : "pause"}`)
  .then((d) => { paused = d.paused; render(); }).catch(showError));

$("#submit-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const path = $("#submit-path").value.trim();
  const overrides = $("#submit-overrides").value.trim().split(/\s+/).filter(Boolean);
  const body = $("#submit-workflow").checked ? {workflow: path, overrides} : {config: path, overrides};
  call("POST", "/api/jobs", body)
    .then((d) => { $("#submit-result").textContent = `queued ${d.ids.map((i) => "#" + i).join(", ")}`; })
    .catch(showError);
});

listen();
// Leases expire without an event: re-draw now and then so a dead worker's job shows as re-queued.
setInterval(render, 5000);
