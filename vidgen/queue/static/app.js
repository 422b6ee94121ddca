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

function row(job) {
  const tr = document.createElement("tr");
  const state = live(job);
  tr.className = `state-${job.state}` + (job.id === selected ? " selected" : "");
  tr.dataset.id = job.id;
  const p = job.progress || {};
  const frac = job.state === "succeeded" ? 1 : (p.total ? p.step / p.total : 0);
  const stage = p.stage ? `${p.stage} ${p.step ?? 0}/${p.total ?? "?"}` : "";
  const thumb = job.kind !== "stitch" && (job.state === "running" || job.state === "succeeded") && job.output
    && /\.(png)$/.test(job.output) ? `<img class="thumb" src="/api/jobs/${job.id}/preview">` : "";
  tr.innerHTML = `<td>${job.id}</td><td class="name"></td><td class="state">${state}</td>
    <td><span class="bar"><span style="width:${Math.round(frac * 100)}%"></span></span> <span class="muted">${stage}</span></td>
    <td>${fmtEta(job.eta_s)}</td><td>${job.attempts}/${job.max_attempts}</td><td>${job.priority}</td><td>${thumb}</td>
    <td class="actions"></td>`;
  tr.querySelector(".name").textContent = job.name || job.kind;
  const actions = tr.querySelector(".actions");
  const add = (label, fn) => {
    const b = document.createElement("button");
    b.type = "button"; b.textContent = label; b.dataset.action = label;
    b.addEventListener("click", (e) => { e.stopPropagation(); fn().catch(showError); });
    actions.appendChild(b);
  };
  if (["queued", "waiting-on-deps", "paused", "running"].includes(job.state)) add("cancel", () => call("POST", `/api/jobs/${job.id}/cancel`));
  if (["queued", "waiting-on-deps", "running"].includes(job.state)) add("pause", () => call("POST", `/api/jobs/${job.id}/pause`));
  if (job.state === "paused") add("resume", () => call("POST", `/api/jobs/${job.id}/resume`));
  if (["failed", "canceled", "blocked-by-guard"].includes(job.state)) add("retry", () => call("POST", `/api/jobs/${job.id}/retry`));
  if (["queued", "waiting-on-deps", "paused"].includes(job.state)) {
    add("up", () => call("PATCH", `/api/jobs/${job.id}`, {priority: job.priority + 1}));
    add("down", () => call("PATCH", `/api/jobs/${job.id}`, {priority: job.priority - 1}));
  }
  tr.addEventListener("click", () => select(job.id));
  return tr;
}

function render() {
  const body = $("#jobs tbody");
  body.replaceChildren();
  const groups = new Map();
  for (const job of [...jobs.values()].sort((a, b) => a.id - b.id)) {
    const key = job.group || "";
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(job);
  }
  for (const [group, members] of groups) {
    if (group) {
      const tr = document.createElement("tr");
      tr.className = "group";
      tr.innerHTML = `<td colspan="9"></td>`;
      tr.firstChild.textContent = group;
      body.appendChild(tr);
    }
    // Shots first (by priority, then order), then the steps that wait on them.
    members.sort((a, b) => (a.kind !== "render") - (b.kind !== "render") || b.priority - a.priority || a.id - b.id);
    for (const job of members) body.appendChild(row(job));
  }
  $("#queue-state").textContent = paused ? "queue paused" : "queue running";
  $("#queue-toggle").textContent = paused ? "Resume queue" : "Pause queue";
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
  } else if (job.state === "running") {
    const img = document.createElement("img");
    img.src = `/api/jobs/${id}/preview?t=${Date.now()}`;
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
  source.onopen = () => { $("#connection").textContent = "live"; };
  source.onerror = () => { $("#connection").textContent = "reconnecting…"; };
  source.addEventListener("job", (e) => {
    const job = JSON.parse(e.data);
    jobs.set(job.id, job);
    render();
    if (job.id === selected && job.state !== "running") select(job.id);
  });
  source.addEventListener("removed", (e) => { jobs.delete(JSON.parse(e.data).id); render(); });
  source.addEventListener("queue", (e) => { paused = JSON.parse(e.data).paused; render(); });
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

refresh().then(listen);
// Leases expire without an event: re-draw now and then so a dead worker's job shows as re-queued.
setInterval(render, 5000);
