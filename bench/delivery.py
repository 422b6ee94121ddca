"""Delivery costs, each as a ratio to the 8-bit path in the same run (docs/delivery.md, docs/benchmarks.md).

    python bench/delivery.py encode                    # per-frame encode of each master vs H.264 8-bit, 832x480
    python bench/delivery.py decode --device cuda      # the 16-bit decode (masters) vs the uint8 one, Wan2.1 VAE
    python bench/delivery.py decode --smoke            # the same code at a tiny width on the CPU

encode: the same 17 decoded frames (a smooth gradient plus noise, so no encoder meets flat colour) written
by vidgen.io.VideoWriter with each codec; also the watermark's embed and the blend retime per frame.
decode: vidgen.vae.decode_frames(deep=True) against deep=False on the same latents, whole-clip
time, frames consumed as the writer would; a Wan2.1 VAE with seeded random weights.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _frames(n: int, h: int, w: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 60000, w)[None, :, None] + np.linspace(0, 5000, h)[:, None, None]
    return [np.clip(ramp + rng.normal(0, 800, (h, w, 3)) + 300 * i, 0, 65535).astype(np.uint16) for i in range(n)]


def _timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def encode(args) -> None:
    from vidgen import watermark
    from vidgen.io import VideoWriter
    from vidgen.masters import to_eight
    from vidgen.retime import retime

    frames = _frames(args.frames, args.height, args.width)
    eight = [to_eight(f) for f in frames]
    cases = [("h264 8-bit (baseline)", "a.mp4", {"codec": "h264"}, eight),
             ("prores hq 10-bit", "a.mov", {"codec": "prores"}, frames),
             ("prores 4444 10-bit", "a.mov", {"codec": "prores", "profile": "4444"}, frames),
             ("dnxhr hqx 10-bit", "a.mov", {"codec": "dnxhr"}, frames),
             ("h265 main10", "a.mp4", {"codec": "h265", "pix_fmt": "yuv420p10le"}, frames),
             ("exr half (linear)", "exr", {"codec": "exr"}, frames),
             ("png16", "png16", {"codec": "png16"}, frames)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, (name, out, kw, data) in enumerate(cases):
            def run(out=Path(tmp) / f"{n}-{out}", kw=kw, data=data):
                with VideoWriter(out, fps=24, width=args.width, height=args.height, overwrite=True, **kw) as w:
                    for f in data:
                        w.write(f)
                return out
            seconds = _timed(run)
            size = sum(p.stat().st_size for p in ([run()] if not run().is_dir() else run().iterdir()))
            rows.append((name, seconds / len(data) * 1000, size / 2**20))
    base = rows[0][1]
    print(f"encode, {args.width}x{args.height}, {args.frames} frames, best of 3")
    print("| codec | ms / frame | x h264 | MiB |\n|---|---|---|---|")
    for name, ms, mib in rows:
        print(f"| {name} | {ms:.1f} | {ms / base:.2f} | {mib:.2f} |")
    mark = _timed(lambda: [watermark.embed(f) for f in eight]) / len(eight) * 1000
    blend = _timed(lambda: list(retime(iter(frames), len(frames), 16, 24, "blend"))) / len(frames) * 1000
    print(f"| watermark embed (8-bit) | {mark:.1f} | {mark / base:.2f} | |")
    print(f"| retime blend 16->24 (per source frame) | {blend:.1f} | {blend / base:.2f} | |")


def decode(args) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from vae import build_vae, latents_for

    from vidgen.vae import decode_frames

    device = "cpu" if args.smoke else args.device
    dtype = torch.float32 if args.smoke else torch.bfloat16
    vae = build_vae("2.1", dtype, device, base_dim=8 if args.smoke else None)
    z = latents_for("2.1", "2x4x4" if args.smoke else args.latent, dtype, device)

    def run(deep: bool):
        for frame in decode_frames(vae, z, space="vae", deep=deep):
            frame.numpy().sum()         # consumed, as the writer does
    run(False)                          # warm-up (kernels, allocator)
    t8, t16 = _timed(lambda: run(False), 2), _timed(lambda: run(True), 2)
    print(f"decode {tuple(z.shape)} on {device} ({dtype}): uint8 {t8:.3f} s, uint16 {t16:.3f} s, "
          f"deep / 8-bit = {t16 / t8:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    e = sub.add_parser("encode")
    e.add_argument("--width", type=int, default=832)
    e.add_argument("--height", type=int, default=480)
    e.add_argument("--frames", type=int, default=17)
    d = sub.add_parser("decode")
    d.add_argument("--device", default="cuda")
    d.add_argument("--latent", default="21x60x104", help="T x H x W latents (21x60x104: 81 frames of 832x480)")
    d.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    encode(args) if args.what == "encode" else decode(args)


if __name__ == "__main__":
    main()
