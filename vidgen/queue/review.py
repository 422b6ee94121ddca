"""Takes and review gates: a shot rendered several times, a person picks one, and only that one goes on.

    - name: hero
      prompt: a fox leaps over a log
      takes: 3                  # seeds seed, seed+1, seed+2 (or a list: takes: [11, 42, 7])
      review: true              # or {decode: preview | full}

Each take is a render job of its own (`<shot>.take<k>.mp4`, its latents kept). With `decode: preview`
(the default) a take is written through the latent preview map instead of the VAE (output.decode:
preview): enough to judge motion and composition, at a tiny fraction of a decode. The shot itself is a
`review` job that depends on its takes: once they have all rendered it waits in the state
`awaiting_review`. Approving take k (`vidgen queue approve JOB K`, the API, the page) records who, when
and which take in the job, and queues it; a worker then decodes take k's saved latents with the exact
decoder to the shot's own file (and its kept frames), so what runs downstream (the shots that continue
from it, the stitch, the contact sheet, which all depend on the review job) uses take k. `reroll` adds
a take (the next seed, or one given) and the shot waits for it; `reject` fails the shot's dependents with
the reason. Every decision is one ledger transaction: a crash loses no take and no decision.
"""

from __future__ import annotations

import copy
import getpass
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import InputError
from .jobs import JobSpec, JobState

DECODES = ("preview", "full")


@dataclass
class ReviewJob:
    """Payload of a `review` job: a shot's takes and the decision on them."""

    shot: str
    """The shot's name (its takes are <name>/take<k> in the ledger)."""
    config: dict
    """The shot's render config: output.path is the shot's own file, the approved take's full decode."""
    takes: list[dict] = field(default_factory=list)
    """Per take, in order (take k is entry k-1): {"seed": S, "output": its review video}."""
    decode: str = "preview"
    """How the takes were decoded for review (output.decode)."""
    approved: Optional[dict] = None
    """{"take": k, "by": who, "at": unix time} once a take is approved."""

    @classmethod
    def of(cls, payload: dict) -> "ReviewJob":
        names = {f for f in cls.__dataclass_fields__}
        if not isinstance(payload, dict) or set(payload) - names or not {"shot", "config"} <= set(payload):
            raise InputError(f"review payload: needs shot and config, allowed keys: {', '.join(sorted(names))}")
        return cls(**payload)


def take_path(output: str, k: int) -> str:
    """Take k's file beside the shot's: shots/03-hero.mp4 -> shots/03-hero.take2.mp4 (a PNG folder: .take2)."""
    p = Path(output)
    return str(p.with_name(f"{p.stem}.take{k}{p.suffix}") if p.suffix else p.with_name(f"{p.name}.take{k}"))


def take_config(config: dict, k: int, seed: int, decode: str) -> dict:
    """Take k's render config from the shot's: its seed and file, decoded for review, latents kept, no
    frames kept (the approved take's full decode keeps them, at the shot's own names)."""
    cfg = copy.deepcopy(config)
    cfg["seed"] = seed
    cfg["output"] = {**cfg.get("output", {}), "path": take_path(cfg["output"]["path"], k), "decode": decode,
                     "keep_frames": [], "save_latents": True}
    return cfg


def plan_takes(config: dict, name: str, seeds: list[int], decode: str, group: str | None,
               deps: list[int], first: int) -> list[JobSpec]:
    """The jobs of a reviewed shot, to be entries `first`... of a submission: one render per seed (each
    depending on `deps`, the shot's own dependencies), then the review job depending on them all."""
    specs = [JobSpec(kind="render", payload=take_config(config, k, seed, decode), name=f"{name}/take{k}",
                     output=take_path(config["output"]["path"], k), group=group, deps=list(deps))
             for k, seed in enumerate(seeds, 1)]
    review = ReviewJob(name.rsplit("/", 1)[-1], config, [{"seed": s, "output": t.output} for s, t in zip(seeds, specs)],
                       decode)
    specs.append(JobSpec(kind="review", payload=asdict(review), name=name, output=config["output"]["path"],
                         group=group, deps=[first + i for i in range(len(seeds))]))
    return specs


def review_problems(takes: Any, review: Any, key: str) -> list[str]:
    """What is wrong with a shot's `takes` and `review` as written."""
    out = []
    if takes is not None and not (isinstance(takes, int) and not isinstance(takes, bool) and 1 <= takes <= 64) and not (
            isinstance(takes, list) and 1 <= len(takes) <= 64 and all(isinstance(s, int) and not isinstance(s, bool)
                                                                      and 0 <= s < 2**63 for s in takes)):
        out.append(f"{key}.takes: {takes!r}; give a count (1..64) or a list of seeds")
    if isinstance(review, dict):
        out += [f"{key}.review.{k}: unknown key; allowed: decode" for k in review if k != "decode"]
        if review.get("decode", "preview") not in DECODES:
            out.append(f"{key}.review.decode: {review.get('decode')!r}; use preview or full")
    elif review is not None and not isinstance(review, bool):
        out.append(f"{key}.review: {review!r}; use true, false or {{decode: preview | full}}")
    if takes not in (None, 1) and takes != [] and not review:
        out.append(f"{key}.takes: several takes need review: true (someone picks the one that goes on)")
    return out


def decode_of(review: Any) -> Optional[str]:
    """How a shot's takes decode for review (preview | full), from `review:` as written; None: no review."""
    if not review:
        return None
    return review.get("decode", "preview") if isinstance(review, dict) else "preview"


def shot_problems(shots: list) -> list[str]:
    """What keeps a workflow's planned shots (workflow.Shot, long takes split) from their review."""
    out = [f"shot {s.take}: takes and review are for a shot of one clip, not a long take's windows"
           for s in shots if s.review and s.take and not s.joins]
    return out + [f"shot {s.name}: review.decode: preview writes frames the guard has not judged; use review: "
                  "{decode: full} with guard.enabled" for s in shots
                  if s.review == "preview" and s.config.guard.enabled and s.config.guard.frames]


def who() -> str:
    """The person at this terminal, for the record of a decision made from the CLI."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


class Reviews:
    """The ledger's review operations (vidgen.queue.ledger.Ledger has them): each one transaction."""

    def _review_row(self, db, job_id: int, states: tuple[str, ...], doing: str):
        row = self._row(db, job_id)
        if row["kind"] != "review":
            raise InputError(f"job #{job_id} is a {row['kind']} job; only a shot with review: true can be {doing}")
        if row["state"] not in states:
            raise InputError(f"job #{job_id} is {row['state']}; it can be {doing} while "
                             f"{' or '.join(states)}")
        return row, ReviewJob.of(json.loads(row["payload"]))

    def _gated(self, db, job_id: int) -> bool:
        """A review job whose takes are all done but no take is approved: it waits for a person."""
        row = self._row(db, job_id)
        return row["kind"] == "review" and not json.loads(row["payload"]).get("approved")

    def approve(self, job_id: int, take: int, by: str | None = None) -> None:
        """Approve take `take` (1-based) of a shot awaiting review: recorded, and the shot queued for the
        full decode of that take, after which its dependents run on it."""
        now = self._clock()
        with self._tx() as db:
            row, rv = self._review_row(db, job_id, (JobState.AWAITING_REVIEW.value,), "approved")
            if not (isinstance(take, int) and not isinstance(take, bool) and 1 <= take <= len(rv.takes)):
                raise InputError(f"job #{job_id} has takes 1..{len(rv.takes)}; {take!r} is not one of them")
            rv.approved = {"take": take, "by": by or who(), "at": now}
            self._set(db, job_id, payload=json.dumps(asdict(rv)))
            self._append_log(db, job_id, now, f"take {take} approved by {rv.approved['by']}")
            self._settle(db, job_id, now)

    def reject(self, job_id: int, reason: str, by: str | None = None) -> None:
        """Reject a shot awaiting review (or waiting on a new take): it fails, and its dependents with it."""
        now = self._clock()
        with self._tx() as db:
            self._review_row(db, job_id, (JobState.AWAITING_REVIEW.value, JobState.WAITING.value), "rejected")
            self._append_log(db, job_id, now, f"rejected by {by or who()}: {reason}")
            self._finish(db, job_id, JobState.FAILED, now, error=f"rejected in review: {reason}")

    def _downstream(self, db, job_id: int) -> dict:
        found, todo = {}, [job_id]
        while todo:
            jid = todo.pop()
            if jid not in found:
                found[jid] = self._row(db, jid)
                todo += [r[0] for r in self._related(db, jid, parents=False)]
        return dict(sorted(found.items()))

    def downstream(self, job_id: int) -> list[tuple[int, str, str, str | None, dict]]:
        """(id, kind, state, output, payload) of the job and every job after it, transitively: what a rerun
        of a finished job sends back (reopen)."""
        with self._tx(write=False) as db:
            rows = self._downstream(db, job_id).values()
        return [(r["id"], r["kind"], r["state"], r["output"], json.loads(r["payload"])) for r in rows]

    def reopen(self, job_id: int) -> JobState:
        """Run a finished job again, and everything after it: those jobs wait again, a shot's approval is
        cleared (its review opens again once its takes are current). The caller has set their earlier files
        aside (api.retry). A job running after it refuses the whole rerun. Returns the job's new state."""
        now = self._clock()
        with self._tx() as db:
            if (state := self._row(db, job_id)["state"]) != JobState.SUCCEEDED.value:
                raise InputError(f"job #{job_id} is {state}; only a finished job is run again this way")
            rows = self._downstream(db, job_id)
            if running := [jid for jid, r in rows.items() if r["state"] == JobState.RUNNING.value]:
                raise InputError(f"job #{running[0]} depends on #{job_id} and is running; wait for it or cancel it")
            for jid, row in rows.items():
                payload = json.loads(row["payload"])
                if payload.pop("approved", None) is not None:
                    self._set(db, jid, payload=json.dumps(payload))
                self._set(db, jid, state=JobState.WAITING.value, attempts=0, result=None, request=None)
                self._append_log(db, jid, now, "runs again" if jid == job_id else f"sent back: #{job_id} runs again")
            return self._settle(db, job_id, now)

    def reroll(self, job_id: int, seed: int | None = None) -> int:
        """Add a take to a shot awaiting review (seed: one past the highest so far, or `seed`); the shot
        waits for it. Returns the new take's job id."""
        now = self._clock()
        with self._tx() as db:
            row, rv = self._review_row(db, job_id, (JobState.AWAITING_REVIEW.value, JobState.WAITING.value),
                                       "rerolled")
            seed = max(t["seed"] for t in rv.takes) + 1 if seed is None else seed
            if not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**63):
                raise InputError(f"reroll seed {seed!r}: give an integer from 0")
            k = len(rv.takes) + 1
            upstream = [d for (d,) in db.execute("SELECT dep FROM deps WHERE job = (SELECT MIN(dep) FROM deps "
                                                  "WHERE job = ?)", (job_id,))]
            spec = JobSpec(kind="render", payload=take_config(rv.config, k, seed, rv.decode),
                           name=f"{row['name']}/take{k}", priority=row["priority"],
                           output=take_path(rv.config["output"]["path"], k), group=row["grp"], after=upstream)
            if problems := spec.problems(0) + self._output_clashes(db, [spec], where=f"take {k} of job #{job_id}"):
                raise InputError("cannot reroll: " + "; ".join(problems))
            new = self._insert(db, spec, upstream, now)
            db.execute("INSERT INTO deps (job, dep) VALUES (?, ?)", (job_id, new))
            rv.takes.append({"seed": seed, "output": spec.output})
            self._set(db, job_id, payload=json.dumps(asdict(rv)))
            self._append_log(db, job_id, now, f"take {k} added (seed {seed}) by {who()}")
            self._settle(db, new, now)
            self._settle(db, job_id, now)
            return new
