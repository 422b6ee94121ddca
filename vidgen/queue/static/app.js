// The queue page: the jobs table, kept current by server-sent events (/api/events), and the actions
// of the JSON API. Plain JavaScript, no build step, nothing fetched from elsewhere; how a row looks
// is in jobs.js (loaded first).
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
    for (const job of members) html.push(row(job, selected));
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
  if (job.state === "awaiting_review") {
    media.appendChild(reviewWall(job));
  } else if (job.state === "succeeded" && job.output) {
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

// The takes of a shot awaiting review, side by side and playing (each take's review copy), each with its
// approve button; reroll adds a take, reject fails what follows the shot (with the reason given).
function reviewWall(job) {
  const wall = document.createElement("div");
  wall.className = "takes";
  wall.id = "takes";
  takes(job).forEach((dep, i) => {
    const cell = document.createElement("figure");
    const video = document.createElement("video");
    Object.assign(video, {src: `/api/jobs/${dep}/preview`, autoplay: true, loop: true, muted: true, controls: true,
                          playsInline: true, className: "take"});
    video.dataset.take = i + 1;
    const button = document.createElement("button");
    Object.assign(button, {type: "button", textContent: `Approve take ${i + 1}`, className: "approve"});
    button.dataset.take = i + 1;
    button.addEventListener("click", () => call("POST", `/api/jobs/${job.id}/approve`, {take: i + 1}).catch(showError));
    cell.append(video, button);
    wall.appendChild(cell);
  });
  const more = document.createElement("div");
  const reroll = Object.assign(document.createElement("button"), {type: "button", textContent: "Reroll", id: "reroll"});
  reroll.addEventListener("click", () => call("POST", `/api/jobs/${job.id}/reroll`, {}).catch(showError));
  const reject = Object.assign(document.createElement("button"), {type: "button", textContent: "Reject", id: "reject"});
  reject.addEventListener("click", () => {
    const reason = window.prompt("Why is the shot rejected?", "");
    if (reason !== null) call("POST", `/api/jobs/${job.id}/reject`, {reason: reason || "rejected"}).catch(showError);
  });
  more.append(reroll, reject);
  wall.appendChild(more);
  return wall;
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

// The stream's state, shown in the header: "live" only while events arrive. The browser retries a
// dropped stream by itself, but gives up for good when the service answers with an error (a restart,
// an expired login): then the page opens a new one, waiting longer each time (up to 30 s). A stream
// silent past two keep-alives (a connection dropped without a word) is replaced too.
let source = null, retry = 1000, heard = 0;
const KEEPALIVE_MS = 15000;

function connection(text, ok) {
  const el = $("#connection");
  el.textContent = text;
  el.classList.toggle("offline", !ok);
}

function listen() {
  const es = source = new EventSource("/api/events");
  const fresh = (handler) => (e) => { if (es === source) { heard = Date.now(); handler(e); } };
  // Changes after this point come as events; the list is read once the stream is open, so none is missed.
  es.onopen = fresh(() => { retry = 1000; connection("live", true); refresh().catch(showError); });
  es.onerror = () => {
    if (es !== source) return;
    if (es.readyState === EventSource.CLOSED) {
      connection(`not live: reconnecting in ${Math.round(retry / 1000)} s`, false);
      setTimeout(listen, retry);
      retry = Math.min(retry * 2, 30000);
    } else connection("not live: reconnecting…", false);
  };
  es.addEventListener("ping", fresh(() => {}));
  es.addEventListener("status", fresh((e) => {
    const s = JSON.parse(e.data);
    connection(s.live ? "live" : `not live: ${s.error || "the service cannot read the queue"}`, s.live);
    if (s.live) refresh().catch(showError);
  }));
  es.addEventListener("resync", fresh(() => refresh().catch(showError)));     // events were dropped: read the list
  es.addEventListener("job", fresh((e) => {
    const job = JSON.parse(e.data);
    jobs.set(job.id, job);
    redraw();
    if (job.id === selected && job.state !== "running") select(job.id);
    else if (job.id === selected && job.preview) {
      const img = $("#detail-preview");
      if (img) img.src = `/api/jobs/${job.id}/preview?v=${job.preview}`; else select(job.id);
    }
  }));
  es.addEventListener("removed", fresh((e) => { jobs.delete(JSON.parse(e.data).id); redraw(); }));
  es.addEventListener("queue", fresh((e) => { paused = JSON.parse(e.data).paused; redraw(); }));
}

setInterval(() => {
  if (source && source.readyState === EventSource.OPEN && Date.now() - heard > 2 * KEEPALIVE_MS + 5000) {
    source.close();
    connection("not live: reconnecting…", false);
    listen();
  }
}, 5000);

$("#queue-toggle").addEventListener("click", () => call("POST", `/api/queue/${paused ? "resume" : "pause"}`)
  .then((d) => { paused = d.paused; render(); }).catch(showError));

function submission() {
  const path = $("#submit-path").value.trim();
  const overrides = $("#submit-overrides").value.trim().split(/\s+/).filter(Boolean);
  return $("#submit-workflow").checked ? {workflow: path, overrides} : {config: path, overrides};
}

// What the submission would cost, before it is queued: each job's seconds and the film's.
$("#submit-estimate").addEventListener("click", () => call("POST", "/api/estimate", submission()).then((d) => {
  if (!d.known) { $("#submit-result").textContent = "no finished renders to learn from yet"; return; }
  const err = d.held_out_error_pct == null ? "unknown" : `${Math.round(d.held_out_error_pct)}%`;
  $("#submit-result").textContent = d.jobs.map((j) => `${j.name}: ${(j.seconds || 0).toFixed(1)} s`).join("\n") +
    `\nwhole film: ${d.gpu_seconds.toFixed(1)} GPU-seconds, ${d.wall_seconds.toFixed(1)} s wall on ${d.workers} ` +
    `worker(s); learned from ${d.learned_from} finished render(s), held-out error ${err}`;
}).catch(showError));

$("#submit-form").addEventListener("submit", (e) => {
  e.preventDefault();
  call("POST", "/api/jobs", submission())
    .then((d) => { $("#submit-result").textContent = `queued ${d.ids.map((i) => "#" + i).join(", ")}`; })
    .catch(showError);
});

listen();
// Leases expire without an event: re-draw now and then so a dead worker's job shows as re-queued.
setInterval(render, 5000);
