#!/usr/bin/env bash
# Prepared script for a lent NVIDIA GPU (at most 5 minutes): the whole-render memory plan measured.
# Real-size random-weight Wan2.2 A14B and TI2V-5B transformers built from the shipped configs; each
# policy (resident bf16, fp8 storage, streamed blocks in bf16 and fp8) under each memory cap
# (torch.cuda.set_per_process_memory_fraction emulating a 24 / 12 / 8 GiB card): peak
# max_memory_allocated, ms per forward at 480p (3 forwards) and 720p (1), ratio to resident bf16.
# Then tiny A14B renders through the real pipeline: streamed, fp8, swapped, streamed with the idle
# expert in its files, fp8 storage with fp8 matmuls (CUDA only); and `vidgen plan` for the target rows
# (the SkyReels-V2 DF presets among them). Then one diffusion-forcing window's forward (bench/forcing_memory.py),
# and one Wan2.2-Animate segment's forward at 1280x720 with its plan on 24 / 48 GiB (bench/animate_memory.py).
# SMOKE=1 runs the same code on the CPU.
set -uo pipefail
if [ "${SMOKE:-0}" != 1 ] && ls .whl/*.whl >/dev/null 2>&1; then   # wheels for the GPU machine's Python
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
DEVICE=cuda; [ "${SMOKE:-0}" = 1 ] && DEVICE=cpu
timeout 200 python3 bench/memory.py gpu 2>&1 | grep -v "should be kept"
# The tiny renders and the plans run in one Python process (vidgen.cli.main per command): on a CPU,
# starting Python with torch and diffusers costs more than a tiny render.
timeout 300 python3 - "$DEVICE" <<'PY' 2>&1 | grep -E "^tiny A14B|memory plan|speed:|wrote|error|^configs/" | cut -c1-300
import contextlib, io, json, re, sys
from vidgen.cli import main
from vidgen.memory import plan_render
from vidgen.presets import load_config
from vidgen.tiny import build_tiny_pipeline

device = sys.argv[1]
build_tiny_pipeline("/tmp/a14b", "wan2.2-t2v-a14b")


def tight() -> list[str]:
    """The idle expert read from its files while the other streams: the largest budget (in 1/64 steps
    below what holding both takes) whose plan reads it back (a bit tighter, the text encoder alone
    waits there)."""
    fixed = [] if device == "cpu" else ["memory.device_budget=1GiB"]
    key = "memory.device_budget" if device == "cpu" else "memory.host_budget"
    base = ["model.path=/tmp/a14b", f"model.device={device}", "memory.placement=stream_blocks", *fixed]
    plan = plan_render(load_config("configs/tiny.yaml", base)).chosen
    budget = plan.device_peak_bytes if device == "cpu" else plan.host_peak_bytes
    while budget > 1:
        budget -= max(1, budget // 64)
        try:
            plan = plan_render(load_config("configs/tiny.yaml", base + [f"{key}={budget}"])).chosen
        except Exception:   # below every plan: none reads the idle expert back at this size
            break
        if plan.idle_expert == "file":
            return [*fixed, f"{key}={budget}"]
    return fixed


fp8mm = ["memory.weights=fp8", "speed.fp8_matmul=true", "model.dtype=bfloat16"]  # fp8 storage + torchao fp8 matmuls
policies = [["memory.placement=stream_blocks"], ["memory.weights=fp8"], ["memory.placement=swap_experts"],
            ["memory.placement=stream_blocks", *tight()]]
if device == "cuda":                    # refused off CUDA (tested there)
    policies += [fp8mm, [*fp8mm, "memory.placement=swap_experts"], [*fp8mm, "memory.placement=stream_blocks"]]
for policy in policies:
    name = re.sub(r"[^a-z0-9]", "-", " ".join(policy))
    print(f"tiny A14B render, {' '.join(policy)}:", flush=True)
    main(["render", "configs/tiny.yaml", "model.path=/tmp/a14b", f"model.device={device}", *policy,
          f"output.path=/tmp/a14b-{name}.mp4", "output.overwrite=true", "sampling.steps=4"])
    sys.stdout.flush()
for row in (["configs/wan2.2-t2v-a14b-720p.yaml", "memory.device_budget=22GiB"],
            ["configs/wan2.2-t2v-a14b-720p.yaml", "memory.device_budget=11GiB"],
            ["configs/wan2.2-ti2v-5b-720p.yaml", "memory.device_budget=7.5GiB"],
            ["configs/wan2.2-vace-a14b-720p.yaml", "memory.device_budget=22GiB"],
            ["configs/skyreels-v2-df-1.3b-540p-long.yaml", "memory.device_budget=22GiB"],
            ["configs/skyreels-v2-df-14b-720p.yaml", "memory.device_budget=80GiB"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["plan", *row, "model.path=/nowhere", "model.device=cuda", "memory.host_budget=96GiB", "--json"])
    d = json.loads(out.getvalue())
    print(" ".join(row), d["placement"], d["weights"], d["device_peak_bytes"], flush=True)
PY
# Diffusion forcing (SkyReels-V2 DF-1.3B, a 97-frame 540p window): measured peak above the weights vs the
# plan's count, causal blocks of 1 (no mask) and 5 (the [tokens, tokens] attention mask).
timeout 120 python3 bench/forcing_memory.py 2>&1 | grep -E "^forcing|Error" | cut -c1-300
# Wan2.2-Animate-14B (all 40 blocks where the card holds them): one 77-frame 1280x720 segment's forward, the
# measured peak above the weights vs the plan's count; then the plan of that render on a 24 and a 48 GiB card.
timeout 150 python3 bench/animate_memory.py 2>&1 | grep -E "^animate|Error" | cut -c1-400
