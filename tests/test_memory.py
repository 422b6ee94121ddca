"""The whole render in a memory budget: the plan made before any weight loads (from the shipped JSON of
the published model folders), every placement and storage dtype rendering on the tiny models, and the
refusal naming the minimum."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hostile import assert_refused
from test_lora import _render, _shapes, write_lora

from vidgen.cli import main
from vidgen.families import VARIANTS_DIR
from vidgen.memory import plan_render
from vidgen.paths import sidecar_path
from vidgen.presets import load_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
ROOT = Path(__file__).resolve().parents[1]


def _plan(preset: str, *overrides: str):
    cfg = load_config(ROOT / "configs" / preset, ["prompt=x", "model.path=/nowhere/not-downloaded", "model.device=cuda",
                                                  "memory.host_budget=96GiB", *overrides])
    return plan_render(cfg).chosen


# The target rows: the budget is the card less headroom, as `auto` leaves it on a real card.
TARGETS = [
    ("wan2.2-t2v-a14b-720p.yaml", ["memory.device_budget=22GiB"], ("swap_experts/fp8", "stream_blocks/bf16")),
    ("wan2.2-t2v-a14b-720p.yaml", ["memory.device_budget=11GiB"], ("stream_blocks/bf16", "stream_blocks/fp8")),
    ("wan2.2-i2v-a14b.yaml", ["memory.device_budget=15GiB", "size=1280x720"],
     ("swap_experts/fp8", "stream_blocks/bf16", "stream_blocks/fp8")),
    ("wan2.2-ti2v-5b-720p.yaml", ["memory.device_budget=7.5GiB"], ("stream_blocks/bf16", "stream_blocks/fp8")),
]


@pytest.mark.parametrize("preset,overrides,allowed", TARGETS, ids=["a14b-24g", "a14b-12g", "i2v-16g", "5b-8g"])
def test_target_plans_from_the_shipped_configs(preset, overrides, allowed):
    plan = _plan(preset, *overrides)
    assert plan.fits and f"{plan.placement}/{plan.weights}" in allowed
    assert plan.device_peak_bytes <= plan.device_budget
    assert plan.slowdown <= 1.15


def test_resident_bf16_first_when_it_fits():
    plan = _plan("wan2.2-t2v-a14b-720p.yaml", "memory.device_budget=139GiB")
    assert (plan.placement, plan.weights, plan.text_encoder) == ("resident", "bf16", "device")
    # two bf16 experts of 14.29 B parameters, the text encoder (5.68 B) and the VAE: at least 64 GiB
    assert plan.stages[0].device_weights >= (2 * 14.288e9 + 5.68e9) * 2


def test_weights_are_counted_from_the_real_configs():
    from vidgen.footprint import model_spec, transformer_weights

    cfg = load_config(ROOT / "configs/wan2.2-t2v-a14b-720p.yaml", ["prompt=x", "model.path=/nowhere"])
    conf = model_spec(cfg).transformer
    bf16, fp8 = transformer_weights(conf, torch.bfloat16, False), transformer_weights(conf, torch.bfloat16, True)
    assert bf16.params == 14_288_491_584                       # the published expert's parameter count
    assert 0.49 < fp8.total / bf16.total < 0.52                # linears in fp8; norms, embeddings stay
    assert bf16.blocks / 40 == pytest.approx(bf16.largest_block, rel=1e-6)


def test_refusal_names_the_minimum_and_reaches_it(capsys):
    code = main(["plan", str(ROOT / "configs/wan2.2-ti2v-5b-720p.yaml"), "model.path=/nowhere", "model.device=cuda",
                 "memory.device_budget=2GiB", "memory.host_budget=96GiB"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "Traceback" not in err
    assert "below the minimum" in err and "stream_blocks" in err
    minimum = err.split("(")[1].split(" with")[0].replace(" ", "")
    assert main(["plan", str(ROOT / "configs/wan2.2-ti2v-5b-720p.yaml"), "model.path=/nowhere", "model.device=cuda",
                 f"memory.device_budget={minimum}", "memory.host_budget=96GiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True


def test_plan_json_before_download(capsys, tmp_path):
    """From model.variant alone, and from a folder holding only the JSON files (no weights yet)."""
    args = [str(ROOT / "configs/wan2.2-t2v-a14b-720p.yaml"), "model.device=cuda", "memory.device_budget=22GiB",
            "memory.host_budget=96GiB", "--json"]
    assert main(["plan", *args, "model.path=/nowhere"]) == 0
    by_variant = json.loads(capsys.readouterr().out)
    for key in ("fits", "device_peak_bytes", "host_peak_bytes", "weights", "placement", "stages"):
        assert key in by_variant
    import shutil

    shutil.copytree(VARIANTS_DIR / "wan2.2-t2v-a14b", tmp_path / "Wan2.2-T2V-A14B-Diffusers")
    assert main(["plan", *args, f"model.path={tmp_path / 'Wan2.2-T2V-A14B-Diffusers'}"]) == 0
    assert json.loads(capsys.readouterr().out) == by_variant


def test_longer_clips_need_more(capsys):
    short = _plan("wan2.2-t2v-a14b-720p.yaml", "memory.device_budget=139GiB", "num_frames=17")
    long = _plan("wan2.2-t2v-a14b-720p.yaml", "memory.device_budget=139GiB", "num_frames=81")
    assert short.stages[1].device_activations < long.stages[1].device_activations


# --------------------------------------------------------------------------------------------
# Rendering with each placement and storage dtype (tiny models, CPU)


def _with(cfg: dict, **memory) -> dict:
    return {**cfg, "memory": memory}


@pytest.mark.parametrize("variant", ["wan2.1-t2v", "wan2.2-t2v-a14b"])
def test_bf16_placements_equal_resident_bit_for_bit(base_cfg, tmp_path, variant):
    cfg = base_cfg(variant)
    resident = _render(_with(cfg, placement="resident"), tmp_path / "a.mp4")
    for i, placement in enumerate(["swap_experts", "stream_blocks"]):
        if placement == "swap_experts" and variant == "wan2.1-t2v":
            continue
        out = _render(_with(cfg, placement=placement), tmp_path / f"b{i}.mp4")
        assert torch.equal(out, resident), placement


def test_fp8_storage_within_its_bound(base_cfg, tmp_path):
    """fp8 weights move the latents by about the float8 rounding of the weights (3 mantissa bits,
    2^-4 relative), far less than the latents' own scale; streamed fp8 equals resident fp8."""
    cfg = base_cfg("wan2.2-t2v-a14b")
    ref = _render(cfg, tmp_path / "a.mp4")
    fp8 = _render(_with(cfg, weights="fp8"), tmp_path / "b.mp4")
    streamed = _render(_with(cfg, weights="fp8", placement="stream_blocks"), tmp_path / "c.mp4")
    err = (fp8 - ref).abs().max().item()
    assert 0 < err <= 0.25 * ref.abs().max().item()
    assert torch.equal(fp8, streamed)


def test_fp8_weights_are_read_as_float8(base_cfg, tmp_path, monkeypatch):
    """Without LoRAs an fp8 expert is never built in model.dtype: its tensors are read from the files
    straight into float8 (no from_pretrained), and the latents equal the cast-after-load path's."""
    from diffusers import WanTransformer3DModel

    from vidgen import loading

    cfg = _with(base_cfg("wan2.2-t2v-a14b"), weights="fp8")
    direct = _render(cfg, tmp_path / "a.mp4")
    late = []
    real = loading.load_components
    monkeypatch.setattr(loading, "load_components", lambda *a, **k: late.append(1) or real(*a, **{**k, "cast_late": True}))
    import vidgen.pipeline
    monkeypatch.setattr(vidgen.pipeline, "load_components", loading.load_components)
    assert torch.equal(_render(cfg, tmp_path / "b.mp4"), direct) and late
    monkeypatch.undo()

    def refuse(*a, **k):
        raise AssertionError("an fp8 expert was loaded in model.dtype")
    monkeypatch.setattr(WanTransformer3DModel, "from_pretrained", refuse)
    assert torch.equal(_render(cfg, tmp_path / "c.mp4"), direct)


def test_lora_with_fp8_and_streaming(base_cfg, tiny_model, tmp_path):
    write_lora(tmp_path / "l.safetensors", "kijai", _shapes(Path(tiny_model())))
    cfg = {**base_cfg(), "loras": [{"path": str(tmp_path / "l.safetensors"), "strength": 0.8}]}
    ref = _render(cfg, tmp_path / "a.mp4")
    plain = _render(base_cfg(), tmp_path / "p.mp4")
    assert torch.equal(_render(_with(cfg, placement="stream_blocks"), tmp_path / "b.mp4"), ref)
    fp8 = _render(_with(cfg, weights="fp8"), tmp_path / "c.mp4")
    assert (fp8 - ref).abs().max() < (plain - ref).abs().max()     # the LoRA is on, fp8 or not


def test_plan_in_the_sidecar_and_the_log(base_cfg, tmp_path, caplog):
    import logging

    import vidgen

    with caplog.at_level(logging.INFO, logger="vidgen"):
        result = vidgen.render(base_cfg())
    assert sum("memory plan:" in r.message for r in caplog.records) == 1
    side = json.loads(sidecar_path(result.path).read_text())
    assert side["memory_plan"]["fits"] and side["memory_plan"]["placement"] == "resident"


def test_render_refuses_a_budget_below_the_minimum(base_cfg, tmp_path, capsys):
    import yaml

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(base_cfg()))
    out = Path(base_cfg()["output"]["path"])
    code = main(["render", str(path), "-q", "memory.device_budget=1MiB"])
    assert_refused(code, capsys.readouterr().err, "memory.device_budget 1.00 MiB is below the minimum")
    assert not out.exists() and not out.parent.exists()


def test_out_of_memory_retry_takes_the_next_cheaper_plan(base_cfg):
    from vidgen.queue.executor import lower_memory

    cfg = base_cfg("wan2.2-t2v-a14b")
    patch = lower_memory({**cfg, "model": {**cfg["model"], "device": "cuda"}, "memory": {"device_budget": "139GiB"}})
    assert patch["memory"] == {"placement": "swap_experts", "weights": "bf16"} and patch["vae"]["memory_budget"] == "1GiB"
    leanest = lower_memory({**cfg, "model": {**cfg["model"], "device": "cuda"},
                            "memory": {"device_budget": "139GiB", "placement": "stream_blocks", "weights": "fp8"}})
    assert "memory" not in leanest


def test_out_of_memory_while_sampling_keeps_the_step(base_cfg, tmp_path, capsys, monkeypatch):
    """One line naming what to lower, exit 2, the newest step saved; --resume then finishes with the
    latents of a render that never stopped."""
    import yaml

    import vidgen
    from vidgen.denoiser import WanDenoiser
    from vidgen.resume import read_latents

    cfg = base_cfg()
    whole = read_latents(vidgen.render({**cfg, "output": {"path": str(tmp_path / "whole.mp4")}}).latents_path)[0]
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    real = WanDenoiser.__call__

    def failing(self, latents, t, i):
        if i == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, latents, t, i)

    monkeypatch.setattr(WanDenoiser, "__call__", failing)
    code = main(["render", str(path), "-q"])
    line = assert_refused(code, capsys.readouterr().err, "out of memory while sampling", "step 2 of 4 is kept",
                          "--resume")
    assert "Tried to allocate 2.00 GiB" in line
    monkeypatch.setattr(WanDenoiser, "__call__", real)
    assert main(["render", str(path), "-q", "--resume"]) == 0
    out = Path(cfg["output"]["path"])
    assert torch.equal(read_latents(out.with_name(out.stem + ".latents.safetensors"))[0], whole)


@pytest.mark.parametrize("placement,weights", [("swap_experts", "bf16"), ("swap_experts", "fp8"),
                                               ("stream_blocks", "bf16"), ("stream_blocks", "fp8")])
def test_idle_expert_read_back_from_its_files(base_cfg, tmp_path, monkeypatch, placement, weights):
    """With room for one expert only, the idle one holds no memory and is read from its safetensors
    files when it runs (and again in a warm pipeline's next render) — onto the device, or into host
    memory to stream from: the latents equal resident's, fp8 storage included (the same casts, from
    the file instead of a loaded copy)."""
    import vidgen
    from vidgen import residency
    from vidgen.weights import stream_blocks
    from vidgen.footprint import model_spec, text_encoder_weights, transformer_weights
    from vidgen.resume import read_latents

    cfg = base_cfg("wan2.2-t2v-a14b", vae={"memory_budget": "40MiB"})
    resident = _render(_with(cfg, placement="resident", weights=weights), tmp_path / "a.mp4")
    swap = _with(cfg, placement=placement, weights=weights)
    loaded = load_config(swap)
    held = plan_render(loaded).chosen
    assert held.idle_expert == "host"
    spec = model_spec(loaded)
    expert = transformer_weights(spec.transformer, torch.float32, weights == "fp8").total
    # tighter than the text encoder waiting in its files alone can reach
    text = text_encoder_weights(spec.text_encoder, torch.float32, weights == "fp8").total
    budget = held.device_peak_bytes - expert // 2 - text
    tight = {**swap, "memory": {**swap["memory"], "device_budget": budget}}
    plan = plan_render(load_config(tight)).chosen
    assert plan.idle_expert == "file" and plan.device_peak_bytes <= budget
    streamed = []       # each expert streamed once a render, once read from its files
    monkeypatch.setattr(residency, "stream_blocks", lambda m, d: (streamed.append(m), stream_blocks(m, d)))
    pipe = vidgen.Pipeline.from_config(tight)
    experts = pipe.components.experts
    assert [next(m.parameters()).device.type for m in experts] == ["meta", "meta"]   # none read yet
    for i in range(2):      # the second render starts from both experts back in their files
        result = pipe.generate(output={"path": str(tmp_path / f"b{i}.mp4")})
        assert torch.equal(read_latents(result.latents_path)[0], resident)
        assert [next(m.parameters()).device.type for m in experts] == ["meta", "meta"]
    assert streamed == (experts * 2 if placement == "stream_blocks" else [])



@pytest.mark.slow
def test_a_small_host_keeps_the_idle_expert_in_its_files():
    """A14B on a 24 GB card in a 32 GB machine: the experts are never both in RAM."""
    plan = _plan("wan2.2-t2v-a14b-720p.yaml", "memory.device_budget=23GiB", "memory.host_budget=30GiB")
    # one expert on the device, the other in RAM, the text encoder in its files (the smaller read)
    assert plan.fits and (plan.placement, plan.idle_expert, plan.idle_text) == ("swap_experts", "host", "file")
    assert plan.host_peak_bytes <= 30 * 2**30 and plan.device_peak_bytes <= 23 * 2**30
    for card in (22, 11):       # too little device memory to swap: streamed, the idle expert still in its files
        plan = _plan("wan2.2-t2v-a14b-720p.yaml", f"memory.device_budget={card}GiB", "memory.host_budget=30GiB")
        assert plan.fits and (plan.placement, plan.idle_expert) == ("stream_blocks", "file")
        assert plan.host_peak_bytes <= 30 * 2**30 and plan.device_peak_bytes <= card * 2**30


@pytest.mark.slow
def test_gpu_memory_script_smoke_mode_runs():
    """The prepared GPU script (bench/gpu_memory.sh) on the CPU at tiny sizes: every policy row, each
    tiny A14B render through the pipeline (the idle expert in its files among them), and the plans of
    the target rows, so the script is ready when a device is lent."""
    import os
    import subprocess

    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_memory.sh")], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**os.environ, "SMOKE": "1"})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"model"')]
    assert len(rows) == 5 and not any(r.get("oom") for r in rows), rows      # uncapped resident + 4 policies
    assert out.count("\nwrote /tmp/a14b-") == 4 and "the idle expert read from its files" in out
    assert out.count("stream_blocks bf16") == 3                                # the target rows' plans


@pytest.mark.slow
def test_text_encoder_read_from_its_files_to_encode(base_cfg, tmp_path):
    """With no room to keep the text encoder between encodes, it waits in its files: read for each
    render's encode and dropped after (a warm pipeline's second render reads it again); the latents
    equal resident's bit for bit, fp8 storage included."""
    import vidgen
    from vidgen.resume import read_latents

    for weights in ("bf16", "fp8"):
        cfg = base_cfg("wan2.1-t2v", vae={"memory_budget": "40MiB"}, memory={"weights": weights})
        resident = _render(cfg, tmp_path / f"a-{weights}.mp4")
        held = plan_render(load_config(cfg)).chosen
        assert held.idle_text == "host"
        tight = {**cfg, "memory": {**cfg["memory"], "device_budget": held.device_peak_bytes - 1}}
        plan = plan_render(load_config(tight)).chosen
        assert plan.idle_text == "file" and plan.fits and "read from its files to encode" in plan.line()
        pipe = vidgen.Pipeline.from_config(tight)
        assert next(pipe.components.text_encoder.parameters()).is_meta                   # not read yet
        for i in range(2):
            result = pipe.generate(output={"path": str(tmp_path / f"b-{weights}{i}.mp4")})
            assert torch.equal(read_latents(result.latents_path)[0], resident), weights
            assert next(pipe.components.text_encoder.parameters()).is_meta               # dropped after encoding


def test_a_small_host_reads_the_text_encoder_from_its_files():
    """A14B at 720p on a 12 GB card in a 16 GB machine: the experts streamed, the idle one and the text
    encoder in their files between turns."""
    plan = _plan("wan2.2-t2v-a14b-720p.yaml", "memory.device_budget=11GiB", "memory.host_budget=16GiB")
    assert plan.fits and (plan.placement, plan.idle_expert, plan.idle_text) == ("stream_blocks", "file", "file")
    assert plan.host_peak_bytes <= 16 * 2**30 and plan.device_peak_bytes <= 11 * 2**30


def test_host_refusal_names_the_minimum_and_reaches_it(capsys):
    """A host budget below every plan that fits the device: the refusal names the least host memory of
    those plans, and that budget is accepted."""
    args = [str(ROOT / "configs/wan2.2-t2v-a14b-720p.yaml"), "model.path=/nowhere", "model.device=cuda",
            "memory.device_budget=11GiB"]
    code = main(["plan", *args, "memory.host_budget=10GiB"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "memory.host_budget 10.00 GiB is below the minimum" in err
    assert "smaller size" not in err                # a shorter clip does not shrink the weights held
    minimum = err.split("(")[1].split(" of host")[0].replace(" ", "")
    assert main(["plan", *args, f"memory.host_budget={minimum}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True


# --------------------------------------------------------------------------------------------
# `vidgen plan` as a newcomer runs it: no GPU here, the docs' own commands, every shipped preset


def test_plan_without_a_gpu_plans_for_the_gpu_a_budget_means(capsys, caplog, monkeypatch):
    """model.device auto, no GPU on this machine and an explicit memory.device_budget: the plan is a CUDA
    render's (bfloat16), as on the card the budget means, and one line says so; model.device=cpu still
    plans this CPU."""
    import logging

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["plan", str(ROOT / "configs/wan2.2-t2v-a14b-720p.yaml"), "memory.device_budget=24GiB",
            "memory.host_budget=96GiB", "--json"]
    with caplog.at_level(logging.INFO, logger="vidgen"):
        assert main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["fits"] and (plan["device_type"], plan["compute_dtype"]) == ("cuda", "bfloat16")
    notes = [r.message for r in caplog.records if "no GPU here" in r.message]
    assert notes == ["no GPU here, so planning for a CUDA GPU (bfloat16) with memory.device_budget 24.00 GiB; "
                     "model.device=cpu plans a render on this CPU"]
    assert main([*args, "model.device=cuda"]) == 0                 # the same plan as naming the device
    assert json.loads(capsys.readouterr().out) == plan
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vidgen"):
        assert main([*args[:-2], "memory.host_budget=auto"]) == 0  # auto host: the note says whose RAM it is
    assert any("memory.host_budget auto is this machine's available RAM" in r.message for r in caplog.records)
    capsys.readouterr()
    code = main([*args, "model.device=cpu"])                      # asked for the CPU: planned for it
    assert_refused(code, capsys.readouterr().err, "memory.device_budget 24.00 GiB is below the minimum for "
                   "wan2.2-t2v-a14b at 1280x720x81 on the CPU", "float32 weights")


def _doc_commands() -> list[tuple[str, str | None]]:
    """Each `vidgen ...` line of docs/memory.md's bash blocks, with the refusal the doc shows right after it
    (a bash block of one command followed by a block that starts `vidgen: error:`), else None."""
    import re

    blocks = re.findall(r"^```(\w*)\n(.*?)^```", (ROOT / "docs/memory.md").read_text(), re.S | re.M)
    out = []
    for i, (lang, body) in enumerate(blocks):
        commands = [line.split("  #")[0].strip() for line in body.splitlines() if line.startswith("vidgen ")]
        if lang != "bash" or not commands:
            continue
        after = blocks[i + 1][1].strip() if i + 1 < len(blocks) and not blocks[i + 1][0] else ""
        shown = after if len(commands) == 1 and after.startswith("vidgen: error:") else None
        out += [(c, shown) for c in commands]
    return out


@pytest.mark.parametrize("command,shown", [pytest.param(c, s, id=c.removeprefix("vidgen plan configs/"))
                                           for c, s in _doc_commands()])
def test_every_command_in_docs_memory_runs_as_written(command, shown, capsys, monkeypatch):
    """Run as written, from the repository root, on a machine without a GPU and with 32 GiB of RAM available
    (what memory.host_budget auto and the decode planner see): a plan (valid JSON with --json), or exactly
    the refusal the doc shows after it."""
    import shlex

    import vidgen.budgets

    free = vidgen.budgets.free_memory
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(vidgen.budgets, "free_memory", lambda d: 32 << 30 if d.type == "cpu" else free(d))
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)
    assert argv[0] == "vidgen"
    code = main(argv[1:])
    out, err = capsys.readouterr()
    if shown is not None:
        assert assert_refused(code, err) == shown
        return
    assert code == 0, err
    if "--json" in argv:
        assert json.loads(out)["fits"] is True
    else:
        assert out.rstrip().endswith("the time of resident bf16") and ": fits;" in out


def _presets() -> list[str]:
    """Every shipped preset: configs/*.yaml less the shared bases that presets name under `defaults:`."""
    return sorted(p.name for p in (ROOT / "configs").glob("*.yaml")
                  if "(they name it under `defaults:`)" not in p.read_text())


@pytest.mark.parametrize("preset", _presets())
def test_every_shipped_preset_plans_without_weights(preset, capsys, monkeypatch):
    """As shipped (model.path not downloaded: the published JSON in vidgen/variants), on a machine without a
    GPU, for an 80 GB card: Wan2.1 I2V's CLIP image encoder included, and the Lightning presets' LoRAs
    not downloaded either."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(ROOT)
    code = main(["plan", f"configs/{preset}", "memory.device_budget=78GiB", "memory.host_budget=256GiB", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    plan = json.loads(out)
    assert plan["fits"] and plan["device_type"] == "cuda"
    if preset.startswith("wan2.1-i2v"):         # the CLIP image encoder (ViT-H/14) is counted where it encodes
        image = next(s for s in plan["stages"] if s["name"] == "image encoding")
        denoise = next(s for s in plan["stages"] if s["name"].startswith("denoising"))
        assert image["device_weights"] - denoise["device_weights"] >= 630e6 * 2      # in bfloat16


def test_wan21_i2v_shipped_json_counts_the_published_sizes():
    """vidgen/variants/wan2.1-i2v-14b: the transformer with its image cross-attention (16.39 B parameters,
    the published diffusers folder's 65.6 GB of float32 shards) and a ViT-H/14 CLIP vision tower."""
    from vidgen.footprint import image_encoder_bytes, model_spec, transformer_weights

    cfg = load_config(ROOT / "configs/wan2.1-i2v-14b-480p.yaml", ["prompt=x", "model.path=/nowhere"])
    spec = model_spec(cfg)
    assert Path(spec.source).name == "wan2.1-i2v-14b" and spec.image_encoder is not None
    assert transformer_weights(spec.transformer, torch.float32, False).params == 16_394_878_784
    clip = image_encoder_bytes(spec.image_encoder, torch.float32)
    assert 0 <= clip - 630_766_080 * 4 < 4096                  # the parameters, and position ids


def test_lora_host_refusal_names_the_loras(tmp_path):
    """A host budget that only the LoRAs break (with them the idle expert cannot wait in its files): the
    refusal names each file and its size, and the plan that fits without them; when the budget is short
    without them too, it does not blame them."""
    from vidgen.footprint import BudgetError

    high = tmp_path / "high_noise_model.safetensors"
    high.write_bytes(b"\0" * (3 << 20))
    loras = f"loras=[{{path: {high}, expert: high}}, {{path: {tmp_path / 'low_noise_model.safetensors'}, expert: low}}]"
    with pytest.raises(BudgetError) as e:
        _plan("wan2.2-t2v-a14b-lightning-4step.yaml", "memory.device_budget=22GiB", "memory.host_budget=22GiB", loras)
    msg = str(e.value)
    assert msg.startswith("memory.host_budget 22.00 GiB is below the minimum") and "\n" not in msg
    assert ("raise it, or render without the LoRAs (high_noise_model.safetensors 3.00 MiB, "
            "low_noise_model.safetensors (not here)): with LoRAs applied the idle expert cannot wait in its files, "
            "and without them stream_blocks, the idle expert read from its files") in msg
    assert _plan("wan2.2-t2v-a14b-lightning-4step.yaml", "memory.device_budget=22GiB", "memory.host_budget=22GiB",
                 "loras=[]").fits
    with pytest.raises(BudgetError) as e:
        _plan("wan2.2-t2v-a14b-lightning-4step.yaml", "memory.device_budget=22GiB", "memory.host_budget=8GiB", loras)
    assert "LoRAs" not in str(e.value)


def test_plan_refuses_a_decode_budget_render_refuses(tmp_path, capsys):
    """vae.memory_budget below the decode's minimum: `vidgen plan` refuses it as `vidgen render` does, with
    the same line (it printed "no plan fits" and then "fits")."""
    from hostile import untouched

    tiny = str(ROOT / "configs/tiny.yaml")
    code = main(["plan", tiny, "vae.memory_budget=1MiB"])
    planned = assert_refused(code, capsys.readouterr().err, "vae.memory_budget 1.00 MiB is below the minimum")
    with untouched(tmp_path):
        code = main(["render", tiny, "-q", "prompt=a fox", "vae.memory_budget=1MiB", f"output.path={tmp_path / 'x.mp4'}"])
    assert assert_refused(code, capsys.readouterr().err) == planned
    assert main(["plan", tiny, "vae.memory_budget=64MiB"]) == 0       # at or above the minimum: planned
    assert "no plan fits" not in capsys.readouterr().out
