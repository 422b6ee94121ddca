"""One render on several devices: the ranks launched, sequence parallel through diffusers, CFG-parallel.

`parallel: {devices: N, ulysses: U, ring: R, cfg: C}` (U x R x C = N) renders one clip with N ranks, one
a device. vidgen builds no collectives of its own:

- **Sequence parallel** is diffusers' context parallelism: each expert gets `enable_parallelism(
  ContextParallelConfig(ulysses_degree=U, ring_degree=R, mesh=...))`. The tokens are split over the U x R
  ranks of a group. Ulysses swaps the split for a split by heads around attention (an all-to-all), so U
  divides the heads. Ring passes keys and values round and merges the partial attentions by their
  log-sum-exp, which diffusers' default (SDPA) backend does not return: with R > 1 the experts run
  diffusers' `_native_flash` backend, aten's flash kernel (bf16/fp16 on CUDA). aten's CPU build has that
  kernel under another name (`_scaled_dot_product_flash_attention_for_cpu`, any float dtype), which
  `_cpu_flash` hands the backend for CPU tensors: the CPU test path. The transformer's output is
  gathered whole on every rank of the group.
- **CFG-parallel** (C = 2): the ranks form two groups. The first evaluates the guided branch and the second
  the unguided one, at the same time; the two velocities are exchanged (all_gather over the pair) and
  combined as one process would.

Every rank then holds the same velocity and steps the same solver on the same latents, so the sampling
is the single process's. Rank 0 alone writes: checkpoints, the latents file, the video and its sidecar.
A checkpoint holds the whole latents, so `--resume` continues it with any number of ranks.

**How ranks start.** `vidgen.render` (and the CLI) spawns the ranks itself (torch.multiprocessing, one a
device: cuda:r for rank r over NCCL; on the CPU, N processes over gloo). Under torchrun (RANK and WORLD_SIZE
in the environment) each process is already a rank and joins the group. Rank 0 passes its progress to the
launching process. A rank that fails, is killed, or waits on the others past `parallel.timeout` ends every
rank; the launcher says so in one line and keeps the newest checkpoint.
"""

from __future__ import annotations

import datetime
import logging
import os
import queue as queues
import shutil
import signal
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .errors import VidgenError

log = logging.getLogger("vidgen")


class RankFailed(VidgenError):
    """A rank of a parallel render failed or was stopped: every rank was stopped (exit code: the rank's, or 1)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Rank:
    """This process's place in a parallel render."""

    rank: int
    world: int
    ulysses: int
    ring: int
    cfg: int
    device: torch.device
    mesh: Any = None            # torch DeviceMesh ("cfg", "ring", "ulysses")
    world_mesh: Any = None      # every rank, one dimension (weight sharding)

    @property
    def cfg_index(self) -> int:
        """0: this rank evaluates the guided branch; 1: the unguided one (CFG-parallel)."""
        return self.rank // (self.world // self.cfg)


CURRENT: Rank | None = None
"""This process's rank while it renders as one (None: a render of its own)."""


def writes() -> bool:
    """Whether this process writes the render's files (rank 0, or no parallel render)."""
    return CURRENT is None or CURRENT.rank == 0


def problems(cfg, info, device: torch.device) -> list[str]:
    """What keeps `cfg.parallel` from running on this model and device (none when it is off)."""
    p = cfg.parallel
    if p.devices == 1:
        return ["memory.placement: shard_blocks shards the weights over a parallel render's ranks; set "
                "parallel.devices (or another placement)"] if cfg.memory.placement == "shard_blocks" else []
    out = []
    if device.type not in ("cuda", "cpu"):
        out.append(f"parallel: runs on CUDA GPUs (or CPU processes, for tests), not on {device.type}; remove parallel "
                   "or set model.device=cuda")
    elif device.type == "cuda" and CURRENT is None and p.devices > torch.cuda.device_count():
        out.append(f"parallel.devices: {p.devices} is more than the {torch.cuda.device_count()} GPUs this process sees")
    if p.ring > 1 and device.type == "cuda" and cfg.model.dtype == "float32":
        out.append("parallel.ring: ring attention runs flash attention, which takes bfloat16 or float16 on CUDA; set "
                   "model.dtype: bfloat16 (or use parallel.ulysses)")
    conf = info.config("transformer")
    heads = int(conf.get("num_attention_heads", 0))
    if p.ulysses > 1 and heads % p.ulysses:
        out.append(f"parallel.ulysses: {p.ulysses} does not divide the model's {heads} attention heads; use a divisor")
    split = p.ulysses * p.ring
    if split > 1:
        from .loading import library

        if getattr(library(info.family.transformer_class), "_cp_plan", None) is None:
            out.append(f"parallel.ulysses / parallel.ring: diffusers has no context-parallel plan for {info.variant}'s "
                       f"{info.family.transformer_class}; use parallel.cfg")
        t, h, w = info.latent_shape(cfg.width, cfg.height, cfg.num_frames)[2:]
        pt, ph, pw = info.patch_size
        tokens = (t // pt) * (h // ph) * (w // pw)
        if tokens % split:
            out.append(f"parallel: {split} ranks do not split the {tokens} tokens of {cfg.size}x{cfg.num_frames} "
                       f"evenly; choose ulysses x ring dividing them, or another size")
    if p.cfg == 2 and not any(s > 1 for s in (cfg.sampling.guidance_scale, cfg.sampling.guidance_scale_2 or 0)):
        out.append("parallel.cfg: 2 puts the guided and unguided branches on two ranks, but guidance_scale <= 1 has "
                   "one branch; use parallel.cfg: 1")
    if cfg.memory.placement == "shard_blocks" and cfg.memory.weights == "fp8":
        out.append("memory.placement: shard_blocks holds model.dtype weights (FSDP2); use memory.weights: bf16 (or auto)")
    if info.family.forcing and p.cfg == 2:
        out.append(f"parallel.cfg: not yet for {info.variant}'s windows; use parallel.ulysses")
    return out


def per_rank_activations(act: int, p, shape: tuple[int, ...], conf, dtype: torch.dtype) -> int:
    """One rank's share of a forward's activations `act` under `p` (config.ParallelConfig): the token-wise
    part split over ulysses x ring, plus the all-to-all (or gathered keys and values) buffers of one
    attention: an upper bound for the parts that do not split (the text's keys and values, the modulation)."""
    split = p.ulysses * p.ring
    if split == 1:
        return act
    b, _, t, h, w = shape
    pt, ph, pw = conf.get("patch_size", (1, 2, 2))
    tokens = (t // pt) * (h // ph) * (w // pw)
    width = conf.get("num_attention_heads", 40) * conf.get("attention_head_dim", 128)
    buffers = 4 * b * -(-tokens // split) * width * dtype.itemsize       # q, k, v and the output, exchanged
    if p.ring > 1:
        buffers += 2 * b * tokens * width * dtype.itemsize // p.ulysses  # the keys and values gathered round the ring
    return -(-act // split) + buffers


@contextmanager
def one_rank_at_a_time(when: bool = True):
    """The block runs on one rank after another (rank 0 first), the others waiting at barriers: ranks that
    read whole experts into host memory before sharding them need one rank's worth of host memory, not N."""
    if not when or CURRENT is None:
        yield
        return
    import torch.distributed as dist

    for _ in range(CURRENT.rank):
        dist.barrier()
    try:
        yield
    finally:
        for _ in range(CURRENT.world - CURRENT.rank):
            dist.barrier()


def shard(experts: list[torch.nn.Module]) -> None:
    """FSDP2 over every rank: each expert's blocks (and then the rest of it) sharded, so a rank holds 1/N of
    the blocks and gathers each one for its forward (reshard after it). The experts come from host
    memory; fully_shard moves each rank's shards onto its device."""
    from torch.distributed.fsdp import fully_shard

    mesh = CURRENT.world_mesh
    for model in experts:
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)


# ----------------------------------------------------------------------------------------- inside a rank

@contextmanager
def _device_lookup():
    """diffusers places a rank on `rank % torch.accelerator.device_count()`, 0 on a CPU-only build: one there."""
    real = torch.accelerator.device_count
    if real() == 0:
        torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = real


def join(rank: int, world: int, layout, device_type: str, timeout: float, rendezvous: str | None = None) -> Rank:
    """Join the process group as `rank` of `world` and build the (cfg, ring, ulysses) mesh; sets CURRENT.
    `rendezvous`: a file the ranks meet at (spawned ranks: no TCP port to race other renders for); None:
    the environment's (torchrun's MASTER_ADDR and MASTER_PORT)."""
    global CURRENT
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    backend = "nccl" if device_type == "cuda" else "gloo"
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout),
                                init_method=f"file://{rendezvous}" if rendezvous else None)
    mesh = init_device_mesh(device_type, (layout.cfg, layout.ring, layout.ulysses), mesh_dim_names=("cfg", "ring", "ulysses"))
    CURRENT = Rank(rank, world, layout.ulysses, layout.ring, layout.cfg, device, mesh,
                   init_device_mesh(device_type, (world,)))
    return CURRENT


def _cpu_flash() -> None:
    """Ring attention on the CPU: diffusers' `_native_flash` backend calls aten's flash kernel for the partial
    attention and its log-sum-exp; aten has none for CPU tensors under that name, but has the same kernel
    as `_scaled_dot_product_flash_attention_for_cpu` (out and log-sum-exp, any float dtype). The backend's
    op is given it for CPU tensors (and keeps its own for the others). No gradients are taken here."""
    from diffusers.models import attention_dispatch as dispatch

    own = dispatch._native_flash_attention_forward_op
    if getattr(own, "vidgen_cpu", False):
        return

    def op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
           return_lse=False, _save_ctx=True, _parallel_config=None):
        if not query.is_cpu:
            return own(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                       _save_ctx=_save_ctx, _parallel_config=_parallel_config)
        q, k, v = (x.transpose(1, 2).contiguous() for x in (query, key, value))     # (B, H, S, D) for the kernel
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal,
                                                                              scale=scale)
        out, lse = out.transpose(1, 2).contiguous(), lse.transpose(1, 2).contiguous()   # (B, S, H, D), (B, S, H)
        return (out, lse) if return_lse else out

    op.vidgen_cpu = True
    dispatch._native_flash_attention_forward_op = op


def apply(experts: list[torch.nn.Module]) -> None:
    """Diffusers' context parallelism on each expert, over this rank's (ring, ulysses) group; with ring
    attention, the flash backend (which returns the log-sum-exp the ring merges by)."""
    r = CURRENT
    if r is None or r.ulysses * r.ring == 1:
        return
    from diffusers import ContextParallelConfig

    if r.ring > 1 and r.device.type == "cpu":
        _cpu_flash()
    for model in experts:
        if r.ring > 1:
            model.set_attention_backend("_native_flash")
        config = ContextParallelConfig(ulysses_degree=r.ulysses, ring_degree=r.ring, mesh=r.mesh["ring", "ulysses"])
        with _device_lookup():
            model.enable_parallelism(config=config)


def exchange_branches(mine: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CFG-parallel: (guided, unguided) velocities from this rank's branch and its partner's."""
    import torch.distributed as dist

    both = [torch.empty_like(mine) for _ in range(2)]
    dist.all_gather(both, mine.contiguous(), group=CURRENT.mesh.get_group("cfg"))
    return both[0], both[1]


def cfg_split() -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
    """The branch exchange when this render splits its branches over ranks, else None."""
    return exchange_branches if CURRENT is not None and CURRENT.cfg == 2 else None


def _rank_main(rank: int, world: int, rendezvous: str, inbox, events, device_type: str, layout, timeout: float,
               work) -> None:
    """One spawned rank: join the group, then render each request from `inbox` ((start, job); None: stop)
    with `work(start, progress, job)` (launch.render_rank or launch.render_warm: this module imports no
    stage). Rank 0 reports progress and its result; every rank says when it is done, or why it failed."""
    from .quiet import quiet_libraries

    quiet_libraries()
    if rank:
        logging.getLogger("vidgen").setLevel(logging.WARNING)

    def progress(stage: str, step: int, total: int) -> None:
        if rank == 0:
            events.put(("progress", stage, step, total))

    try:
        join(rank, world, layout, device_type, timeout, rendezvous)
        while (request := inbox.get()) is not None:
            start, job = request
            result = work(start, progress, job)
            events.put(("result", rank, result if rank == 0 else None))
    except VidgenError as e:
        events.put(("error", rank, e.exit_code, str(e)))
        raise SystemExit(e.exit_code) from None
    except BaseException as e:      # noqa: BLE001 - reported to the launcher in one line
        events.put(("error", rank, 1, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"))
        raise SystemExit(1) from None
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


# ----------------------------------------------------------------------------------------- the launcher

class Ranks:
    """The ranks of parallel renders, spawned here once (torch.multiprocessing, one a device) and kept: each
    render is one request to every rank, whose `work` may keep its model loaded between them."""

    def __init__(self, layout, device_type: str, timeout: float, work):
        import torch.multiprocessing as mp

        self.n, self.layout, self.timeout = layout.devices, layout, timeout
        ctx = mp.get_context("spawn")
        self.events = ctx.Queue()
        self.rendezvous = os.path.join(tempfile.mkdtemp(prefix="vidgen-ranks-"), "rendezvous")   # the ranks meet there
        self.inboxes = [ctx.Queue() for _ in range(self.n)]
        self.procs = [ctx.Process(target=_rank_main, daemon=True, args=(r, self.n, self.rendezvous, self.inboxes[r],
                                                                        self.events, device_type, layout, timeout, work))
                      for r in range(self.n)]
        for p in self.procs:
            p.start()

    def run(self, start, job: dict | None = None, progress: Callable[[str, int, int], None] | None = None):
        """Render `start` (resume.Start) on every rank; rank 0's result. RankFailed (one line) when a rank fails
        or is killed, or waits past the timeout: every rank is stopped then (close)."""
        for inbox in self.inboxes:
            inbox.put((start, job))
        result, done, failure, errors = None, set(), None, []
        try:
            while failure is None and len(done) < self.n:
                try:
                    event = self.events.get(timeout=0.2)
                except queues.Empty:
                    event = None
                if event is not None and event[0] == "progress" and progress is not None:
                    progress(*event[1:])
                elif event is not None and event[0] == "result":
                    done.add(event[1])
                    result = event[2] if event[1] == 0 else result
                elif event is not None and event[0] == "error":
                    errors.append(event[1:])
                if errors or any(p.exitcode is not None for p in self.procs):
                    failure = _failure(self.procs, self.events, errors, self.n, self.timeout)
        except BaseException:
            self.close(force=True)
            raise
        if failure is not None:
            self.close(force=True)
            raise failure
        return result

    @property
    def alive(self) -> bool:
        return all(p.exitcode is None for p in self.procs)

    def close(self, force: bool = False) -> None:
        """Stop every rank: asked to (after its current render), or at once with `force`."""
        if not force:
            for inbox in self.inboxes:
                inbox.put(None)
        deadline = time.monotonic() + (0 if force else 30)
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                p.terminate()
        deadline = time.monotonic() + 10
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                os.kill(p.pid, signal.SIGKILL)
                p.join()
        shutil.rmtree(os.path.dirname(self.rendezvous), ignore_errors=True)


def launch(start, work, progress: Callable[[str, int, int], None] | None = None, device_type: str = "cpu",
           job: dict | None = None):
    """Run `work(start, progress, job)` (launch.render_rank) on cfg.parallel.devices ranks spawned for it;
    returns rank 0's result. `progress(stage, step, total)` gets rank 0's reports. RankFailed (one line)
    when a rank fails or is killed: every rank is stopped."""
    cfg = start.config
    ranks = Ranks(cfg.parallel, device_type, cfg.parallel.timeout, work)
    try:
        result = ranks.run(start, job, progress)
    finally:
        ranks.close()
    if result is None:
        raise RankFailed(f"the {ranks.n} ranks ended without rank 0's result")
    return result


def _failure(procs, events, errors: list, n: int, timeout: float) -> RankFailed:
    """The one line for a parallel render that went wrong: the rank that died (by a signal, or an exit
    without a word) before the others' failed collectives, else the first rank's own error."""
    deadline = time.monotonic() + 2.0       # a rank whose peer died fails its collective; the death is the cause
    while time.monotonic() < deadline and not any(p.exitcode is not None and p.exitcode < 0 for p in procs):
        time.sleep(0.05)
    while True:
        try:
            e = events.get_nowait()
        except queues.Empty:
            break
        if e[0] == "error":
            errors.append(e[1:])
    keep = "every rank was stopped, and the newest sampling checkpoint is kept: add --resume to continue (with any number of ranks)"
    for r, p in enumerate(procs):
        if p.exitcode is not None and p.exitcode < 0:
            return RankFailed(f"rank {r} of {n} was killed by signal {-p.exitcode}; {keep}")
    spoke = {e[0] for e in errors}
    for r, p in enumerate(procs):
        if p.exitcode not in (None, 0) and r not in spoke:
            return RankFailed(f"rank {r} of {n} exited with code {p.exitcode}; {keep}")
    rank, code, message = errors[0]
    if "timed out" in message.lower() or "timeout" in message.lower():
        return RankFailed(f"rank {rank} of {n} waited on the others longer than parallel.timeout ({timeout:g} s); {keep}")
    if code != 2 and ("gloo" in message or "NCCL" in message or "Connection" in message):
        return RankFailed(f"rank {rank} of {n} lost its peers ({message[:120]}); {keep}")
    return RankFailed(f"rank {rank} of {n}: {message}", code)


def torchrun_rank() -> tuple[int, int] | None:
    """(rank, world size) when this process was started by torchrun (or another launcher setting RANK and
    WORLD_SIZE) as one of several ranks, else None."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return (rank, world) if world > 1 else None
