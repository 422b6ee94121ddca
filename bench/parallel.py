"""One transformer forward on N GPUs through diffusers' context parallelism (what vidgen.parallel applies),
timed: the speed-up of sequence parallelism at a real size, with seeded random weights.

    python bench/parallel.py --ranks 4                          # Wan2.1 T2V-14B (one A14B expert), 1280x720x81
    python bench/parallel.py --ranks 2 --folder wan2.1-t2v-1.3b --size 832x480
    python bench/parallel.py --ranks 4 --ring 2                 # Ulysses 2 x ring 2
    python bench/parallel.py --ranks 2 --cpu --folder wan2.1-t2v-1.3b --size 64x64 --frames 9   # gloo smoke

Each rank builds the transformer from the shipped config on its GPU (bf16), applies Ulysses over all
ranks (ring attention over `--ring` of them: diffusers' flash backend, as vidgen.parallel sets it), runs one warm-up and `--forwards` timed forwards on the same input; rank 0 prints the median
seconds a forward and the largest difference from a one-rank forward it ran first (correctness).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _rank(rank: int, a, port: int) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from vidgen import parallel
    from vidgen.families import VARIANTS_DIR

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cpu") if a.cpu else torch.device("cuda", rank)
    dtype = torch.float32 if a.cpu else torch.bfloat16
    if not a.cpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if a.cpu else "nccl", rank=rank, world_size=a.ranks)
    from diffusers import ContextParallelConfig

    from memory import _model      # bench/memory.py: seeded random weights, built on meta

    conf = {k: v for k, v in json.loads((VARIANTS_DIR / a.folder / "transformer" / "config.json").read_text()).items()
            if not k.startswith("_")}
    model = _model(conf, dtype, str(device))
    w, h = (int(x) for x in a.size.split("x"))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, conf["in_channels"], (a.frames - 1) // 4 + 1, h // 8, w // 8, generator=g).to(device, dtype)
    text = (torch.randn(1, 512, conf["text_dim"], generator=g) * 0.1).to(device, dtype)
    t = torch.tensor([500], device=device)

    def forward():
        with torch.no_grad():
            out = model(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
        if not a.cpu:
            torch.cuda.synchronize()
        return out

    ref = forward() if rank == 0 else None
    ulysses = a.ranks // a.ring
    if a.ranks > 1:
        mesh = init_device_mesh(device.type, (a.ring, ulysses), mesh_dim_names=("ring", "ulysses"))
        if a.ring > 1:
            if a.cpu:
                parallel._cpu_flash()
            model.set_attention_backend("_native_flash")
        with parallel._device_lookup():
            model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=ulysses, ring_degree=a.ring, mesh=mesh))
    out = forward()                        # warm-up
    times = []
    for _ in range(a.forwards):
        t0 = time.perf_counter()
        forward()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"parallel: {a.folder} {a.size}x{a.frames}, {a.ranks} rank(s) (Ulysses {ulysses} x ring {a.ring}): "
              f"{statistics.median(times):.3f} s a forward (runs {', '.join(f'{s:.3f}' for s in times)}); "
              f"max |out - one rank| = {(out.float() - ref.float()).abs().max().item():.3g}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--ring", type=int, default=1, help="ring degree (divides --ranks; the rest is Ulysses)")
    ap.add_argument("--folder", default="wan2.1-t2v-14b")
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--forwards", type=int, default=2)
    ap.add_argument("--cpu", action="store_true", help="gloo ranks on the CPU (a correctness smoke)")
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(_rank, args=(a, port), nprocs=a.ranks, join=True, start_method="spawn")


if __name__ == "__main__":
    main()
