"""Counted scaling of one denoising step over several GPUs: FLOPs and bytes per rank, and the step time
they predict, for a shipped model at a size (no GPU needed; `bench/gpu_parallel.sh` measures).

    python bench/parallel_scaling.py                       # Wan2.2 A14B (one expert) at 1280x720x81
    python bench/parallel_scaling.py --folder wan2.1-t2v-1.3b --size 832x480 --frames 81

Per step with guidance: two forwards (guided, unguided) of the transformer over T tokens (latent frames x
height/16 x width/16). FLOPs: vidgen.footprint.transformer_flops. Sequence parallel over N ranks splits
both forwards' tokens N ways; Ulysses moves, per block and rank, four all-to-alls of its T/N x width
bf16 activations ((N-1)/N of each leaves the rank: q, k, v in, the output back); ring (as diffusers runs
it, all-gathering keys and values) receives (N-1)/N of 2 x T x width per block. CFG-parallel runs the two
forwards on two groups and exchanges the T x z_dim output once per step. Predicted time: FLOPs at the
stated sustained rate plus bytes at the link's rate, not overlapped (an upper bound on the time).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vidgen.families import VARIANTS_DIR  # noqa: E402
from vidgen.footprint import transformer_flops  # noqa: E402

LINKS = {"NVLink (H100/H200, 450 GB/s each way)": 450e9, "PCIe 4.0 x16 (25 GB/s)": 25e9}
SUSTAINED = 400e12          # bf16 FLOP/s one H100 sustains on these matmuls (about 40% of its dense peak)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", default="wan2.2-t2v-a14b")
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--text", type=int, default=512)
    a = ap.parse_args()
    conf = json.loads((VARIANTS_DIR / a.folder / "transformer" / "config.json").read_text())
    w, h = (int(x) for x in a.size.split("x"))
    t = (a.frames - 1) // 4 + 1
    shape = (1, conf["in_channels"], t, h // 8, w // 8)
    tokens = t * (h // 16) * (w // 16)
    width, layers = conf["num_attention_heads"] * conf["attention_head_dim"], conf["num_layers"]
    flops = 2 * transformer_flops(conf, shape, a.text)          # guided + unguided forward
    print(f"{a.folder} {a.size}x{a.frames}: {tokens} tokens, {flops / 1e12:.1f} TFLOP a step (two forwards)")
    print("| layout | ranks | TFLOP a rank | bytes a rank, a step | predicted step, NVLink | predicted step, PCIe 4.0 |")
    print("|---|---|---|---|---|---|")
    for name, n, cfg, ring in (("one GPU", 1, 1, 1), ("Ulysses 2", 2, 1, 1), ("Ring 2", 2, 1, 2), ("CFG 2", 2, 2, 1),
                               ("Ulysses 4", 4, 1, 1), ("Ring 4", 4, 1, 4), ("CFG 2 x Ulysses 2", 4, 2, 1),
                               ("Ulysses 8", 8, 1, 1), ("Ulysses 4 x Ring 2", 8, 1, 2), ("CFG 2 x Ulysses 4", 8, 2, 1)):
        sp = n // cfg                                             # sequence-parallel ranks of a group
        ulysses = sp // ring
        per_rank = flops / n
        forwards = 2 // cfg                                       # forwards each rank runs a step
        # Ulysses: q, k, v and the output of the rank's T/sp tokens, (U-1)/U of each to the others, bf16
        a2a = forwards * layers * 4 * (tokens / sp) * width * 2 * (ulysses - 1) / ulysses
        # ring: after Ulysses a rank holds T/R tokens of width/U; it gathers the other R-1 ranks' keys and values
        gathered = forwards * layers * 2 * (tokens / ring) * (ring - 1) * (width / ulysses) * 2
        exchange = tokens * 4 * conf["out_channels"] * 2 if cfg == 2 else 0.0      # T x (z*4 patch) bf16 out
        moved = a2a + gathered + exchange
        times = [per_rank / SUSTAINED + moved / bw for bw in LINKS.values()]
        base = flops / SUSTAINED
        print(f"| {name} | {n} | {per_rank / 1e12:.1f} | {moved / 2**30:.2f} GiB | {times[0]:.2f} s ({base / times[0]:.2f}x) "
              f"| {times[1]:.2f} s ({base / times[1]:.2f}x) |")


if __name__ == "__main__":
    main()
