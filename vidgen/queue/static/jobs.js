// The queue page's pure parts: how a job looks in the table. No DOM access here, so Node can load
// this file to test it (tests/test_service.py); app.js draws and listens.
"use strict";

function live(job, now = Date.now()) {
  // A running job whose lease has expired has lost its worker: it will be taken back (re-queued).
  if (job.state === "running" && job.lease_expires && job.lease_expires * 1000 < now) return "re-queued";
  return job.state;
}

function fmtEta(s) {
  if (s == null) return "";
  s = Math.round(s);
  return s >= 60 ? `${Math.floor(s / 60)}m ${s % 60}s` : `${s}s`;
}

const esc = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

// Progress belongs to a job at work: a running or paused job shows its stage and step ("denoise
// 3/20"); a finished or waiting one shows none, whatever its last report was.
const AT_WORK = ["running", "paused"];

function stageLabel(job) {
  const p = job.progress || {};
  if (!AT_WORK.includes(job.state) || !p.stage) return "";
  return `${p.stage} ${p.step ?? 0}/${p.total ?? "?"}`;
}

function fraction(job) {
  const p = job.progress || {};
  if (job.state === "succeeded") return 1;
  return AT_WORK.includes(job.state) && p.total ? Math.min(1, (p.step || 0) / p.total) : 0;
}

// Which actions a job in each state offers (the buttons of its row).
function actions(job) {
  const out = [];
  if (["queued", "waiting-on-deps", "paused", "running", "awaiting_review"].includes(job.state)) out.push("cancel");
  if (["queued", "waiting-on-deps", "running"].includes(job.state)) out.push("pause");
  if (job.state === "paused") out.push("resume");
  if (["failed", "canceled", "blocked-by-guard"].includes(job.state)) out.push("retry");
  if (["queued", "waiting-on-deps", "paused"].includes(job.state)) out.push("up", "down");
  return out;
}

// A shot awaiting review: its takes are the jobs it depends on, take 1 the oldest (a reroll adds newer ones).
function takes(job) {
  return job.kind === "review" ? [...(job.deps || [])].sort((a, b) => a - b) : [];
}

// One row as HTML (the table is drawn as one string: a redraw of 1,000 jobs stays in milliseconds).
function row(job, selected) {
  const state = live(job);
  // A render in progress shows its latest preview (the denoised estimate, then the first decoded
  // frames; `preview` is the image's version); a finished still shows itself.
  const thumb = job.preview ? `<img class="thumb preview" src="/api/jobs/${job.id}/preview?v=${job.preview}">`
    : job.kind !== "stitch" && job.state === "succeeded" && /\.(png)$/.test(job.output || "")
    ? `<img class="thumb" src="/api/jobs/${job.id}/preview">` : "";
  const buttons = actions(job).map((a) => `<button type="button" data-action="${a}">${a}</button>`).join("");
  const bar = `<span class="bar"><span style="width:${Math.round(fraction(job) * 100)}%"></span></span>`;
  const eta = AT_WORK.includes(job.state) ? fmtEta(job.eta_s) : "";
  return `<tr class="state-${esc(job.state)}${job.id === selected ? " selected" : ""}" data-id="${job.id}">
    <td>${job.id}</td><td class="name">${esc(job.name || job.kind)}</td><td class="state">${esc(state)}${
      job.waits ? `<div class="muted waits">${esc(job.waits)}</div>` : ""}</td>
    <td>${bar} <span class="muted">${esc(stageLabel(job))}</span></td>
    <td>${eta}</td><td>${job.attempts}/${job.max_attempts}</td><td>${job.priority}</td><td>${thumb}</td>
    <td class="actions">${buttons}</td></tr>`;
}

if (typeof module !== "undefined") module.exports = {live, fmtEta, esc, stageLabel, fraction, actions, takes, row};
