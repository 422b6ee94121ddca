"""The film's cost before it runs: each shot's GPU-seconds and the whole workflow's wall time on the live
workers, predicted from the ledger's own finished renders (`vidgen queue submit --estimate FILE`).

The model is counted work times a rate learned from the ledger, per model variant and device:
- sampling work: the transformer's FLOPs a forward (vidgen.footprint.transformer_flops, from the model's
  config.json), times the forwards a step (2 with guidance) and the steps;
- decode work: output pixels times frames;
- a job's time = its overhead + sampling work x the sampling rate + decode work x the decode rate.
The rates are the medians of the finished jobs' own ratios (the stage timings they recorded: `denoise`,
`decode_write`), the overhead the median of what their wall time (start to finish) left beyond those; a
worker's first render pays a load on top (learned from each worker's first), and the stitch and contact
sheet take their kinds' median times, and each job the median gap a worker leaves between two jobs.
The error reported is held out: each finished job predicted from the others (leave-one-out), as the mean
absolute error in percent of its wall time. The wall time lays the jobs out in dependency order on the
live workers (each job to the worker free first), as the queue would run them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .jobs import Job, JobSpec, JobState


@dataclass
class Sample:
    """One finished render: its counted work and the times it recorded."""

    key: str                # variant / device
    sampling: float         # FLOPs
    decode: float           # pixels x frames
    denoise_s: float
    decode_s: float
    wall_s: float


@dataclass
class Model:
    """Rates per variant/device key (and over all jobs, for a key never seen): (sampling s/FLOP, decode
    s/pixel, overhead s), and what they were learned from."""

    rates: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    steps: dict[str, float] = field(default_factory=dict)     # stitch, contact sheet: their median time
    load_s: float = 0.0     # what a worker's first render takes beyond the others (loading the model)
    gap_s: float = 0.0      # a worker's time between one job's end and the next one's start (the ledger's)

    def predict(self, key: str, sampling: float, decode: float) -> float | None:
        rate = self.rates.get(key) or self.rates.get("*")
        return None if rate is None else rate[2] + sampling * rate[0] + decode * rate[1]


def work(payload: dict, infos: dict) -> tuple[str, float, float]:
    """(variant key, sampling FLOPs, decode pixel-frames) of a render config (payload); `infos` caches the
    model folders read."""
    from ..footprint import transformer_flops
    from ..presets import load_config
    from ..sources import inspect

    cfg = load_config(payload)
    key = repr(cfg.model)
    info = infos.get(key) or inspect(cfg.model)
    infos[key] = info
    conf = info.config("transformer")
    forwards = 2 if cfg.sampling.guidance_scale > 1 or (cfg.sampling.guidance_scale_2 or 0) > 1 else 1
    shape = info.latent_shape(cfg.width, cfg.height, cfg.num_frames)
    flops = transformer_flops(conf, shape, cfg.model.max_sequence_length) * forwards * cfg.sampling.steps
    return info.variant, flops, float(cfg.width * cfg.height * cfg.num_frames)


def fit(samples: list[Sample]) -> Model:
    """Rates per key, and over all samples ("*")."""
    model = Model(samples=list(samples))
    groups: dict[str, list[Sample]] = {"*": list(samples)}
    for s in samples:
        groups.setdefault(s.key, []).append(s)
    for key, group in groups.items():
        if group:
            model.rates[key] = (statistics.median(s.denoise_s / s.sampling for s in group),
                                statistics.median(s.decode_s / s.decode for s in group),
                                statistics.median(max(0.0, s.wall_s - s.denoise_s - s.decode_s) for s in group))
    return model


def calibrate(ledger) -> Model:
    """The model from the ledger's finished jobs: renders with their stage timings and wall time, the
    other kinds' times, and the load a worker's first render paid (attempts tell the worker)."""
    infos: dict = {}
    samples, steps, first, spans = [], {}, {}, {}
    for j in ledger.jobs(JobState.SUCCEEDED):
        if not j.started or not j.finished:
            continue
        owner = (ledger.history(j.id) or [{}])[-1].get("owner")       # the worker of its last attempt
        spans.setdefault(owner, []).append((j.started, j.finished))
        t = (j.result or {}).get("timings") or {}
        if (j.result or {}).get("reused"):
            continue
        if j.kind != "render":
            steps.setdefault(j.kind, []).append(j.finished - j.started)
            continue
        if "denoise" not in t:
            continue
        try:
            variant, sampling, decode = work(j.payload, infos)
        except Exception:       # noqa: BLE001 - a job whose model folder is gone teaches nothing now
            continue
        device = (j.result or {}).get("device", "cpu" if (j.payload.get("model") or {}).get("device") == "cpu" else "gpu")
        samples.append(Sample(f"{variant}/{device}", sampling, decode, float(t["denoise"]),
                              float(t.get("decode_write", 0.0)), j.finished - j.started))
        if owner not in first or j.started < first[owner][0]:
            first[owner] = (j.started, samples[-1])
    model = fit(samples)
    model.steps = {k: statistics.median(v) for k, v in steps.items()}
    gaps = [b[0] - a[1] for runs in spans.values() for a, b in zip(sorted(runs), sorted(runs)[1:]) if 0 <= b[0] - a[1] < 60]
    model.gap_s = statistics.median(gaps) if gaps else 0.0
    if model.rates:
        overhead = model.rates["*"][2]
        model.load_s = statistics.median(max(0.0, s.wall_s - s.denoise_s - s.decode_s - overhead)
                                         for _, s in first.values())
    return model


def held_out_error(model: Model) -> float | None:
    """Mean |predicted - measured| / measured of each sample predicted from the others (percent)."""
    if len(model.samples) < 2:
        return None
    errors = []
    for i, s in enumerate(model.samples):
        p = fit(model.samples[:i] + model.samples[i + 1:]).predict(s.key, s.sampling, s.decode)
        errors.append(abs(p - s.wall_s) / s.wall_s)
    return 100 * statistics.fmean(errors)


def estimate(specs: list[JobSpec], model: Model, workers: int, device: str | None = None) -> dict:
    """Per job (render: its predicted seconds; stitch and the rest: none), and the film's GPU-seconds and
    wall time laid out on `workers` in dependency order; `device`: whose rates (default: the device most
    of the finished renders ran on)."""
    infos: dict = {}
    if device is None:
        device = statistics.mode([s.key.split("/", 1)[1] for s in model.samples]) if model.samples else "cpu"
    seconds, rows = [], []
    for spec in specs:
        if spec.kind == "render":
            variant, sampling, decode = work(spec.payload, infos)
            s = model.predict(f"{variant}/{device}", sampling, decode)
        elif spec.kind == "review":     # the approved take's full decode
            variant, _, decode = work(spec.payload["config"], infos)
            rate = model.rates.get(f"{variant}/{device}") or model.rates.get("*")
            s = None if rate is None else rate[2] + decode * rate[1]
        else:
            s = model.steps.get(spec.kind, 0.0)
        seconds.append((s or 0.0) + model.gap_s)
        rows.append({"name": spec.name or spec.kind, "kind": spec.kind, "seconds": s})
    used = min(max(1, workers), sum(spec.kind == "render" for spec in specs) or 1)
    free, done = [model.load_s] * used + [0.0] * (max(1, workers) - used), []     # each worker loads the model once
    for spec, s in zip(specs, seconds):     # specs come in dependency order
        ready = max([done[d] for d in spec.deps], default=0.0)
        k = min(range(len(free)), key=lambda i: max(free[i], ready))
        start = max(free[k], ready)
        free[k] = start + s
        done.append(start + s)
    return {"jobs": rows, "gpu_seconds": sum(seconds) + used * model.load_s, "wall_seconds": max(done, default=0.0),
            "workers": max(1, workers), "learned_from": len(model.samples), "held_out_error_pct": held_out_error(model),
            "known": bool(model.rates)}


def report(est: dict) -> str:
    """The estimate as the CLI prints it."""
    if not est["known"]:
        return ("no finished renders in this ledger to learn from: run some (the estimate learns its rates from "
                "them), then ask again")
    lines = [f"{r['name']:<40} {r['kind']:<13} {r['seconds']:8.1f} s" for r in est["jobs"] if r["seconds"] is not None]
    err = est["held_out_error_pct"]
    lines.append(f"whole film: {est['gpu_seconds']:.1f} GPU-seconds, {est['wall_seconds']:.1f} s wall on "
                 f"{est['workers']} worker(s); learned from {est['learned_from']} finished render(s), held-out error "
                 + (f"{err:.0f}%" if err is not None else "unknown (one job)"))
    return "\n".join(lines)
