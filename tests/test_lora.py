"""LoRA files in the layouts people have: each equals a hand-merged copy of the model, per expert,
fused == adapter, warm swaps equal fresh loads bit for bit, and every bad file is refused in one line."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import shutil
from pathlib import Path
from unittest.mock import ANY

import pytest
import torch
import yaml
from hostile import assert_refused, untouched
from safetensors.torch import load_file, save_file

import vidgen
from vidgen.cli import main
from vidgen.errors import ConfigError, InputError
from vidgen.paths import sidecar_path
from vidgen.pipeline import Pipeline
from vidgen.resume import read_latents

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# (diffusers module, Wan's name, kohya spelling of Wan's name) of the layers the test LoRAs touch
LAYERS = [("blocks.0.attn1.to_q", "blocks.0.self_attn.q"), ("blocks.1.attn2.to_out.0", "blocks.1.cross_attn.o"),
          ("blocks.0.ffn.net.0.proj", "blocks.0.ffn.0"), ("proj_out", "head.head"),
          ("condition_embedder.time_proj", "time_projection.1")]
RANK, ALPHA = 4, 2.0


def _pairs(shapes: dict, seed: int = 1) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for module, _ in LAYERS:
        o, i = shapes[module + ".weight"]
        out[module] = (torch.randn(RANK, i, generator=g) * 0.3, torch.randn(o, RANK, generator=g) * 0.3)
    return out


def _extras(shapes: dict, seed: int = 2) -> dict[str, torch.Tensor]:
    """LightX2V's extras: a bias delta of a LoRA'd layer, a norm's weight and bias deltas (diffusers names)."""
    g = torch.Generator().manual_seed(seed)
    return {"blocks.0.attn1.to_q.bias": torch.randn(shapes["blocks.0.attn1.to_q.bias"], generator=g) * 0.3,
            "blocks.0.norm2.weight": torch.randn(shapes["blocks.0.norm2.weight"], generator=g) * 0.3,
            "blocks.0.norm2.bias": torch.randn(shapes["blocks.0.norm2.bias"], generator=g) * 0.3}


def write_lora(path: Path, fmt: str, shapes: dict, seed: int = 1) -> tuple[dict, dict]:
    """A LoRA in layout `fmt`; returns (low-rank pairs, full deltas) it means, in diffusers' names,
    with alpha/rank already folded into the pairs."""
    pairs, sd = _pairs(shapes, seed), {}
    alpha = fmt in ("kijai", "lightx2v", "musubi")
    for module, wan in LAYERS:
        down, up = pairs[module]
        name = {"peft": f"transformer.{module}", "comfy": f"diffusion_model.{wan}", "bare": wan,
                "model-prefix": f"model.diffusion_model.{wan}", "kijai": f"diffusion_model.{wan}",
                "lightx2v": f"diffusion_model.{wan}", "musubi": "lora_unet_" + wan.replace(".", "_")}[fmt]
        a, b = ("lora_down", "lora_up") if alpha else ("lora_A", "lora_B")
        sd[f"{name}.{a}.weight"], sd[f"{name}.{b}.weight"] = down.clone(), up.clone()
        if alpha:
            sd[f"{name}.alpha"] = torch.tensor(ALPHA)
    scale = ALPHA / RANK if alpha else 1.0
    full = {}
    if fmt == "lightx2v":
        ex = _extras(shapes, seed + 1)
        sd["diffusion_model.blocks.0.self_attn.q.diff_b"] = ex["blocks.0.attn1.to_q.bias"]
        sd["diffusion_model.blocks.0.norm3.diff"] = ex["blocks.0.norm2.weight"]
        sd["diffusion_model.blocks.0.norm3.diff_b"] = ex["blocks.0.norm2.bias"]
        full = ex
    save_file(sd, str(path))
    return {m: (d * scale, u) for m, (d, u) in pairs.items()}, full


def merged_copy(model: Path, dest: Path, experts: dict[str, tuple[dict, dict, float]]) -> Path:
    """A copy of the model folder whose expert weights were merged by hand: W + s * up @ down, + s * deltas."""
    shutil.copytree(model, dest)
    for folder, (pairs, full, s) in experts.items():
        (f,) = (dest / folder).glob("*.safetensors")
        sd = load_file(str(f))
        for module, (down, up) in pairs.items():
            sd[module + ".weight"] = sd[module + ".weight"] + s * (up @ down)
        for name, delta in full.items():
            sd[name] = sd[name] + s * delta
        save_file(sd, str(f))
    return dest


def _shapes(model: Path, folder: str = "transformer") -> dict:
    from vidgen.lora import folder_shapes

    return folder_shapes(model / folder)


def _latents(result) -> torch.Tensor:
    return read_latents(result.latents_path)[0]


def _render(cfg: dict, out: Path, **extra) -> torch.Tensor:
    cfg = {**cfg, "output": {"path": str(out)}, **extra}
    return _latents(vidgen.render(cfg))


@pytest.mark.parametrize("fmt", ["peft", "comfy", "bare", "model-prefix", "musubi",     # kijai, lightx2v: the slow run
                                 *(pytest.param(f, marks=pytest.mark.slow) for f in ("kijai", "lightx2v"))])
def test_each_layout_equals_a_hand_merged_model(base_cfg, tiny_model, tmp_path, fmt):
    model = Path(tiny_model())
    pairs, full = write_lora(tmp_path / "l.safetensors", fmt, _shapes(model))
    merged = merged_copy(model, tmp_path / "merged", {"transformer": (pairs, full, 0.7)})
    cfg = base_cfg()
    with_lora = _render(cfg, tmp_path / "a.mp4", loras=[{"path": str(tmp_path / "l.safetensors"), "strength": 0.7}])
    by_hand = _render({**cfg, "model": {**cfg["model"], "path": str(merged)}}, tmp_path / "b.mp4")
    plain = _render(cfg, tmp_path / "c.mp4")
    assert (with_lora - by_hand).abs().max().item() <= 1e-5
    assert (with_lora - plain).abs().max().item() > 1e-3          # the LoRA does something


def test_fused_equals_adapter_and_strength_zero_is_none(base_cfg, tiny_model, tmp_path):
    write_lora(tmp_path / "l.safetensors", "lightx2v", _shapes(Path(tiny_model())))
    cfg = base_cfg()
    lora = [{"path": str(tmp_path / "l.safetensors"), "strength": 0.8}]
    fused = _render(cfg, tmp_path / "a.mp4", loras=lora, lora_mode="fuse")
    adapter = _render(cfg, tmp_path / "b.mp4", loras=lora, lora_mode="adapter")
    assert (fused - adapter).abs().max().item() <= 1e-5
    zero = _render(cfg, tmp_path / "c.mp4", loras=[{**lora[0], "strength": 0.0}], lora_mode="fuse")
    assert torch.equal(zero, _render(cfg, tmp_path / "d.mp4"))


def test_expert_high_changes_only_the_high_noise_expert(base_cfg, tiny_model, tmp_path):
    model = Path(tiny_model("wan2.2-t2v-a14b"))
    write_lora(tmp_path / "h.safetensors", "kijai", _shapes(model))
    cfg = base_cfg("wan2.2-t2v-a14b")
    cfg["output"] = {"path": str(tmp_path / "a.mp4")}
    fresh = Pipeline.from_config(cfg)
    for mode in ("fuse", "adapter"):
        pipe = Pipeline.from_config({**cfg, "lora_mode": mode,
                                     "loras": [{"path": str(tmp_path / "h.safetensors"), "expert": "high"}]})
        high, low = pipe.components.experts
        merged = dict(high.named_parameters()) if mode == "fuse" else None
        for (name, p), q in zip(low.state_dict().items(), fresh.components.experts[1].state_dict().values()):
            assert torch.equal(p, q), (mode, name)
        assert not getattr(low, "peft_config", None)
        if merged is not None:
            assert not torch.equal(merged["proj_out.weight"], dict(fresh.components.experts[0].named_parameters())["proj_out.weight"])
        else:
            assert "lora0" in high.peft_config


@pytest.mark.slow
def test_swaps_in_a_warm_pipeline_equal_fresh_loads(base_cfg, tiny_model, tmp_path):
    shapes = _shapes(Path(tiny_model()))
    write_lora(tmp_path / "a.safetensors", "lightx2v", shapes, seed=1)
    write_lora(tmp_path / "b.safetensors", "musubi", shapes, seed=5)
    cfg = base_cfg()
    a = [{"path": str(tmp_path / "a.safetensors"), "strength": 0.9}]
    b = [{"path": str(tmp_path / "b.safetensors"), "strength": 1.2}]
    for mode in ("adapter", "fuse"):
        warm = Pipeline.from_config({**cfg, "lora_mode": mode, "output": {"path": str(tmp_path / mode / "w0.mp4")}})
        for i, loras in enumerate((a, b, [], a, b, [{**b[0], "strength": 0.4}])):   # the last: strength only
            job = {**cfg, "lora_mode": mode, "loras": loras}
            got = _latents(warm.generate({**job, "output": {"path": str(tmp_path / mode / f"w{i}.mp4")}}))
            fresh = Pipeline.from_config({**job, "output": {"path": str(tmp_path / mode / f"f{i}.mp4")}})
            want = _latents(fresh.generate())
            assert torch.equal(got, want), (mode, i)


def test_records_and_resume_know_the_file(base_cfg, tiny_model, tmp_path):
    write_lora(tmp_path / "l.safetensors", "comfy", _shapes(Path(tiny_model())))
    cfg = base_cfg(loras=[{"path": str(tmp_path / "l.safetensors"), "strength": 0.5}])
    result = vidgen.render(cfg)
    side = json.loads(sidecar_path(result.path).read_text())
    sha = hashlib.sha256((tmp_path / "l.safetensors").read_bytes()).hexdigest()
    assert side["loras"] == [{"path": str(tmp_path / "l.safetensors"), "sha256": sha, "strength": 0.5, "expert": "both"}]
    assert side["config"]["loras"][0]["sha256"] == sha        # the config (so its digest) holds the file's hash
    from vidgen.presets import load_config
    from vidgen.resume import _lora_diffs

    assert _lora_diffs(load_config(cfg), side["config"]) == []             # same file, strength, expert
    moved = tmp_path / "moved.safetensors"
    shutil.copy(tmp_path / "l.safetensors", moved)
    assert _lora_diffs(load_config({**cfg, "loras": [{"path": str(moved), "strength": 0.5}]}), side["config"]) == []
    for other in ({"path": str(moved), "strength": 0.6}, {"path": str(moved), "strength": 0.5, "sha256": "0" * 64}):
        assert _lora_diffs(load_config({**cfg, "loras": [other]}), side["config"])
    assert _lora_diffs(load_config({**cfg, "loras": []}), side["config"])


def test_modules_the_model_lacks_are_named_in_one_warning(base_cfg, tiny_model, tmp_path, caplog):
    shapes = _shapes(Path(tiny_model()))
    write_lora(tmp_path / "l.safetensors", "comfy", shapes)
    sd = load_file(str(tmp_path / "l.safetensors"))
    for o in ("k_img", "v_img"):       # a Wan2.1-I2V LoRA's image keys on a text-to-video model
        sd[f"diffusion_model.blocks.0.cross_attn.{o}.lora_A.weight"] = torch.zeros(RANK, 32)
        sd[f"diffusion_model.blocks.0.cross_attn.{o}.lora_B.weight"] = torch.zeros(32, RANK)
    save_file(sd, str(tmp_path / "l.safetensors"))
    with caplog.at_level(logging.WARNING, logger="vidgen"):
        vidgen.render(base_cfg(loras=[{"path": str(tmp_path / "l.safetensors")}]))
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(lines) == 1 and "blocks.0.cross_attn.k_img" in lines[0] and "blocks.0.cross_attn.v_img" in lines[0]
    caplog.clear()
    from vidgen.lora import plan_lora

    with caplog.at_level(logging.WARNING, logger="vidgen"):        # one file on two experts: one warning
        plans = plan_lora(tmp_path / "l.safetensors", 1.0, "both", [shapes, shapes])
    assert len(plans) == 2 and [p.skipped for p in plans] == [["blocks.0.cross_attn.k_img", "blocks.0.cross_attn.v_img"]] * 2
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 1


def _bad_files(tmp: Path, shapes: dict) -> dict[str, tuple[Path, str]]:
    out = {}
    out["missing"] = (tmp / "nope.safetensors", "does not exist")
    torch.save({"a": torch.zeros(1)}, tmp / "pickle.safetensors")
    out["pickle"] = (tmp / "pickle.safetensors", "pickle")
    (tmp / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    out["corrupt"] = (tmp / "junk.safetensors", "safetensors")
    save_file({"blocks.0.attn1.to_q.lora_A.weight": torch.zeros(RANK, 32),
               "blocks.0.attn1.to_q.lora_B.weight": torch.zeros(32, RANK)}, str(tmp / "none.safetensors"))
    save_file({"unet.down_blocks.0.attentions.0.to_q.lora_A.weight": torch.zeros(RANK, 32),
               "unet.down_blocks.0.attentions.0.to_q.lora_B.weight": torch.zeros(32, RANK)}, str(tmp / "sd.safetensors"))
    out["matches-nothing"] = (tmp / "sd.safetensors", "matches a layer")
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.zeros(RANK, 5120),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.zeros(5120, RANK)},
              str(tmp / "big.safetensors"))
    out["other-size"] = (tmp / "big.safetensors", "another model size")
    save_file({"diffusion_model.blocks.0.self_attn.q.lokr_w1": torch.zeros(4, 4)}, str(tmp / "lokr.safetensors"))
    out["lokr"] = (tmp / "lokr.safetensors", "LoKr")
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.full((RANK, 32), float("nan")),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.zeros(32, RANK)}, str(tmp / "nan.safetensors"))
    out["nan"] = (tmp / "nan.safetensors", "NaN")
    # Shapes the size check alone let through, each crashing after load (or loading half an adapter)
    q = "diffusion_model.blocks.0.self_attn.q"
    for case, down, up, needle in (("rank-0", (0, 32), (32, 0), "rank 0"),
                                   ("up-extra-dim", (RANK, 32), (32, RANK, 2), "lora_up.weight' has shape [32, 4, 2]"),
                                   ("down-extra-dim", (RANK, 16, 2), (32, RANK), "lora_down.weight' has shape [4, 16, 2]"),
                                   ("rank-mismatch", (RANK, 32), (32, 2 * RANK), "rank 8, but its lora_down has rank 4")):
        save_file({f"{q}.lora_down.weight": torch.ones(down), f"{q}.lora_up.weight": torch.ones(up)},
                  str(tmp / f"{case}.safetensors"))
        out[case] = (tmp / f"{case}.safetensors", needle)
    g = torch.Generator().manual_seed(3)
    save_file({f"{q}.lora_down.weight": torch.randn(RANK, 32, generator=g),
               f"{q}.lora_up.weight": torch.randn(32, RANK, generator=g),
               f"{q}.alpha": torch.tensor(3e38)}, str(tmp / "inf-alpha.safetensors"))
    out["inf-alpha"] = (tmp / "inf-alpha.safetensors", "beyond float32's range")
    return out


@pytest.mark.parametrize("case", ["missing", "pickle", "corrupt", "matches-nothing", "other-size", "lokr", "nan",
                                  "rank-0", "up-extra-dim", "down-extra-dim", "rank-mismatch", "inf-alpha",
                                  "expert-high", "negative", "not-finite"])
def test_bad_loras_are_refused_in_one_line(capsys, base_cfg, tiny_model, tmp_path, case):
    files = tmp_path / "loras"
    files.mkdir()
    bad = _bad_files(files, _shapes(Path(tiny_model())))
    good = files / "good.safetensors"
    write_lora(good, "kijai", _shapes(Path(tiny_model())))
    lora, needle = ({"path": str(bad[case][0])}, bad[case][1]) if case in bad else {
        "expert-high": ({"path": str(good), "expert": "high"}, "two-expert"),
        "negative": ({"path": str(good), "strength": -0.5}, "strength"),
        "not-finite": ({"path": str(good), "strength": float("inf")}, "strength")}[case]
    cfg = base_cfg(loras=[lora])
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    with untouched(files, out if out.exists() else tmp_path / "c.yaml"):
        code = main(["render", str(tmp_path / "c.yaml"), "-q"])
    err = capsys.readouterr().err
    assert_refused(code, err, needle, *([bad[case][0].name] if case in bad else []))
    assert not (out / "clip.mp4").exists()


def _nan_file(path: Path) -> Path:
    """A LoRA whose header fits the tiny model and whose values are NaN: refused only when read."""
    save_file({"diffusion_model.blocks.1.self_attn.k.lora_down.weight": torch.full((RANK, 32), float("nan")),
               "diffusion_model.blocks.1.self_attn.k.lora_up.weight": torch.zeros(32, RANK)}, str(path))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["adapter", "fuse"])
def test_a_failed_swap_leaves_the_warm_pipeline_as_it_was(base_cfg, tiny_model, tmp_path, mode):
    """A list with one bad file among good ones fails with nothing of it applied: the next no-LoRA job
    is a plain render (and its sidecar says so), the next LoRA job equals a fresh pipeline's."""
    shapes = _shapes(Path(tiny_model()))
    write_lora(tmp_path / "a.safetensors", "lightx2v", shapes, seed=1)
    write_lora(tmp_path / "b.safetensors", "kijai", shapes, seed=5)
    bad = _nan_file(tmp_path / "bad.safetensors")
    cfg = {**base_cfg(), "lora_mode": mode}
    a, b = {"path": str(tmp_path / "a.safetensors"), "strength": 0.9}, {"path": str(tmp_path / "b.safetensors")}
    warm = Pipeline.from_config({**cfg, "output": {"path": str(tmp_path / "w0.mp4")}})
    out = itertools.count(1)

    def job(loras):
        return warm.generate({**cfg, "loras": loras, "output": {"path": str(tmp_path / f"w{next(out)}.mp4")}})

    fresh = {name: _latents(Pipeline.from_config({**cfg, "loras": loras,
                                                  "output": {"path": str(tmp_path / f"f-{name}.mp4")}}).generate())
             for name, loras in (("none", []), ("a", [a]))}
    for before in ([], [a]):                      # from a plain pipeline and from one holding a LoRA
        if before:
            assert torch.equal(_latents(job(before)), fresh["a"])
        with pytest.raises(InputError, match="bad.safetensors"):
            job([b, {"path": str(bad)}])
        assert warm.loras == ((mode, ((a | {"sha256": ANY, "expert": "both"},),)) if before else ())
        plain = job([])
        assert torch.equal(_latents(plain), fresh["none"]), before
        side = json.loads(sidecar_path(plain.path).read_text())
        assert not side.get("loras") and side["config"]["loras"] == []
        assert not getattr(warm.components.experts[0], "peft_config", None)
        assert torch.equal(_latents(job([a])), fresh["a"]), before
        job([])


class _Boom(torch.OutOfMemoryError):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["adapter", "fuse"])
def test_a_failure_while_applying_takes_every_lora_off(base_cfg, tiny_model, tmp_path, monkeypatch, mode):
    """Out of memory midway through applying (after one expert's LoRA, or PEFT half-injected by a real
    failed load_lora_adapter): every LoRA comes off, the next jobs equal fresh pipelines; a pipeline
    that cannot be put back is dropped and a Renderer loads a new one."""
    from vidgen import lora
    from vidgen.pipeline import Renderer
    from vidgen.presets import load_config

    model = Path(tiny_model("wan2.2-t2v-a14b"))
    write_lora(tmp_path / "a.safetensors", "kijai", _shapes(model), seed=1)
    write_lora(tmp_path / "b.safetensors", "comfy", _shapes(model), seed=4)
    cfg = {**base_cfg("wan2.2-t2v-a14b"), "lora_mode": mode}
    a, b = {"path": str(tmp_path / "a.safetensors")}, {"path": str(tmp_path / "b.safetensors"), "strength": 0.6}
    names = itertools.count()

    def conf(loras):
        return load_config({**cfg, "loras": loras, "output": {"path": str(tmp_path / f"r{next(names)}.mp4")}})

    fresh = {k: _latents(Renderer().render(conf(v))) for k, v in (("none", []), ("a", [a]))}
    renderer = Renderer(lora_auto=mode)
    renderer.render(conf([b]))
    warm = renderer.pipeline
    real_fuse, real_load = lora.fuse, type(warm.components.experts[0]).load_lora_adapter
    calls = []

    def fuse_then_boom(model, staged, changed=None):
        calls.append(model)
        if len(calls) == 2:              # the second expert, the first one fused
            raise _Boom("out of memory")
        return real_fuse(model, staged, changed)

    def half_load(self, state, **kw):    # the real load, on a pair PEFT cannot take: it fails half-injected
        calls.append(self)
        if len(calls) == 2:
            state = {k: (v.repeat(1, 2) if "lora_B" in k else v) for k, v in state.items()}
        return real_load(self, state, **kw)

    if mode == "fuse":
        monkeypatch.setattr(lora, "fuse", fuse_then_boom)
    else:
        monkeypatch.setattr(type(warm.components.experts[0]), "load_lora_adapter", half_load)
    with pytest.raises((_Boom, RuntimeError)):
        renderer.render(conf([a, b]))
    monkeypatch.undo()
    assert renderer.pipeline is warm and not warm.broken and warm.loras == ()
    assert torch.equal(_latents(renderer.render(conf([]))), fresh["none"])
    assert torch.equal(_latents(renderer.render(conf([a]))), fresh["a"])

    # Taking the LoRAs off fails too: the pipeline is marked and the next render loads a fresh one.
    monkeypatch.setattr(lora, "detach", lambda model: (_ for _ in ()).throw(RuntimeError("stuck")))
    with pytest.raises(RuntimeError, match="stuck"):
        renderer.render(conf([b]))
    monkeypatch.undo()
    assert warm.broken and not warm.loaded_for(conf([]))
    with pytest.raises(ConfigError, match="could not take a failed LoRA swap off"):
        warm.generate(conf([]))
    assert torch.equal(_latents(renderer.render(conf([a]))), fresh["a"])
    assert renderer.pipeline is not warm


def test_pair_shapes_of_conv_and_linear_layers():
    """A linear layer takes down [r, in] / up [out, r]; a conv layer (the patch embedding) conv-shaped
    or flattened pairs; no other shape passes, and the part named is the one at fault."""
    from vidgen.lora import _pair_problem

    lin, conv = (32, 32), (32, 16, 1, 2, 2)
    for down, up, weight in (((4, 32), (32, 4), lin), ((4, 16, 1, 2, 2), (32, 4, 1, 1, 1), conv), ((4, 64), (32, 4), conv)):
        assert _pair_problem(down, up, weight) is None
    for down, up, weight, part, hint in (
            ((4, 16, 2, 1, 2), (32, 4), conv, "down", "another layout"), ((4, 64), (32, 4, 2), conv, "up", "another layout"),
            ((4, 64), (32, 4, 1), conv, "up", "another layout"), ((4, 32, 1), (32, 4), lin, "down", "another layout"),
            ((4,), (32, 4), lin, "down", "another model size"), ((4, 32), (32,), lin, "up", "another layout"),
            ((4, 64), (32, 4), lin, "down", "another model size"), ((4, 32), (48, 4), lin, "up", "another model size"),
            ((4, 32), (32, 2), lin, "up", "rank 2, but its lora_down has rank 4"), ((0, 32), (32, 0), lin, "down", "rank 0")):
        got = _pair_problem(down, up, weight)
        assert got is not None and got[0] == part and hint in got[1], (down, up, weight, got)


def test_one_file_twice_on_an_expert_is_refused_with_the_summed_strength(capsys, base_cfg, tiny_model, tmp_path):
    """Listed twice (by content, whatever the path) a LoRA would apply twice: refused, saying what to
    list instead; the same file once per expert (high / low) applies and is recorded per expert."""
    write_lora(tmp_path / "a.safetensors", "kijai", _shapes(Path(tiny_model("wan2.2-t2v-a14b"))))
    shutil.copy(tmp_path / "a.safetensors", tmp_path / "copy.safetensors")
    a, copy = str(tmp_path / "a.safetensors"), str(tmp_path / "copy.safetensors")
    for variant, loras, needle in (
            ("wan2.1-t2v", [{"path": a, "strength": 0.5}, {"path": copy, "strength": 0.7}],
             "a.safetensors: listed more than once for one expert (loras[0], loras[1], the same file by its SHA-256); "
             "list it once, with strength 1.2 (the strengths add)"),
            ("wan2.2-t2v-a14b", [{"path": a, "strength": 0.5}, {"path": a, "expert": "high"}],
             "list it once per expert, with the strengths added: expert: high, strength: 1.5; expert: low, strength: 0.5")):
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(base_cfg(variant, loras=loras)))
        with untouched(tmp_path):
            code = main(["render", str(tmp_path / "c.yaml"), "-q"])
        assert_refused(code, capsys.readouterr().err, needle)
    per_expert = [{"path": a, "expert": "high"}, {"path": copy, "expert": "low", "strength": 0.6}]
    result = vidgen.render(base_cfg("wan2.2-t2v-a14b", loras=per_expert))
    side = json.loads(sidecar_path(result.path).read_text())["loras"]
    assert [(r["path"], r["expert"], r["strength"]) for r in side] == [(a, "high", 1.0), (copy, "low", 0.6)]


def _alpha_file(path: Path, alpha: float, module: str = "blocks.0.self_attn.q", seed: int = 3) -> Path:
    g = torch.Generator().manual_seed(seed)
    save_file({f"diffusion_model.{module}.lora_down.weight": torch.randn(RANK, 32, generator=g) * 0.3,
               f"diffusion_model.{module}.lora_up.weight": torch.randn(32, RANK, generator=g) * 0.3,
               f"diffusion_model.{module}.alpha": torch.tensor(alpha)}, str(path))
    return path


def test_an_update_that_dwarfs_its_weights_warns_in_one_line(base_cfg, tiny_model, tmp_path, caplog):
    """alpha 1000 on rank 4 (x250): one warning line over both experts, naming the file, the layer and
    the alpha; a LoRA of ordinary size, or the same file at a strength that tames it, says nothing."""
    model = Path(tiny_model("wan2.2-t2v-a14b"))
    big = _alpha_file(tmp_path / "big.safetensors", 1000.0)
    write_lora(tmp_path / "ok.safetensors", "kijai", _shapes(model))
    for loras, expected in (([{"path": str(big)}, {"path": str(tmp_path / "ok.safetensors")}], 1),
                            ([{"path": str(big), "strength": 0.01}], 0), ([{"path": str(tmp_path / "ok.safetensors")}], 0)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="vidgen"):
            vidgen.render(base_cfg("wan2.2-t2v-a14b", loras=loras, output={"path": str(tmp_path / "o" / "{seed}.mp4")}))
        lines = [r.getMessage() for r in caplog.records if "the size of the weight" in r.getMessage()]
        assert len(lines) == expected, lines
        if expected:
            assert lines[0].startswith("LoRA big.safetensors: at strength 1 its update is ")
            assert "blocks.0.attn1.to_q" in lines[0] and "alpha 1000 for rank 4" in lines[0]


def test_updates_beyond_the_weights_dtype_are_refused(tiny_model, tmp_path):
    """Each file's update in range but their sum not; an update float32 holds but float16 does not; a
    fused weight that overflows its dtype: refused with nothing changed."""
    from vidgen.lora import LoraPlan, plan_lora
    from vidgen.lora_deltas import Staged, fuse, stage

    shapes = _shapes(Path(tiny_model()))
    one = torch.zeros(1, 32)
    one[0, 0] = 1.0                                    # down = e1, up = e1: the update's norm is alpha (rank 1)
    for name in ("x", "y"):
        save_file({"blocks.0.attn1.to_q.lora_A.weight": one, "blocks.0.attn1.to_q.lora_B.weight": one.T.clone().contiguous(),
                   "blocks.0.attn1.to_q.alpha": torch.tensor(2e38)}, str(tmp_path / f"{name}.safetensors"))
    plans = [plan_lora(tmp_path / f"{n}.safetensors", 1.0, "both", [shapes])[0] for n in ("x", "y")]
    stage(plans[:1])
    with pytest.raises(InputError, match=r"^LoRAs x.safetensors, y.safetensors: their updates to blocks.0.attn1.to_q.weight "
                                         r"add up to beyond float32's range; lower their strengths$"):
        stage(plans)
    half = plan_lora(_alpha_file(tmp_path / "h.safetensors", 4e5), 1.0, "both", [shapes])
    stage(half)
    with pytest.raises(InputError, match="beyond float16's range; check the file's alpha or lower the strength"):
        stage(half, torch.float16)

    layer = torch.nn.Module()
    layer.lin = torch.nn.Linear(2, 2).half()
    with torch.no_grad():
        layer.lin.weight.fill_(65000.0)
    before = layer.lin.weight.clone()
    plan = LoraPlan(tmp_path / "z.safetensors", 1.0, "both", "0" * 64, [], [])
    changed: list[str] = []
    with pytest.raises(InputError, match="z.safetensors: fused into lin.weight it gives values beyond float16's range"):
        fuse(layer, [Staged(plan, {"lin": {"diff": torch.full((2, 2), 1000.0)}}, {})], changed)
    assert changed == [] and torch.equal(layer.lin.weight, before)


def test_fuse_holds_one_parameters_delta_at_a_time():
    """Fusing makes each weight's float32 delta from its low-rank pair and drops it once added: live
    memory stays near one layer's worth, not the sum over every layer (56 GB for a LoRA on every
    linear layer of a 14B expert), and the weights equal the deltas added one LoRA after another."""
    from vidgen.lora import LoraPlan
    from vidgen.lora_deltas import Staged, fuse
    from vidgen.vae.memsim import LiveBytes

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(16)]).requires_grad_(False)
    before = {n: p.clone() for n, p in model.named_parameters()}
    pair = lambda: {"down": torch.randn(4, 256), "up": torch.randn(256, 4)}  # noqa: E731
    staged = [Staged(LoraPlan(Path(f"{n}.safetensors"), s, "both", "0" * 64, [], []),
                     {str(i): pair() for i in range(16)}, {}) for n, s in (("a", 0.5), ("b", 2.0))]
    with LiveBytes("cpu") as live:
        for p in model.parameters():        # the weights themselves are counted from the start
            live.track(p)
        held = live.current
        changed = fuse(model, staged)
    layer = 256 * 256 * 4
    assert live.peak - held <= 4 * layer, live.peak - held      # all 16 deltas at once would be 16 layers
    assert changed == sorted(f"{i}.weight" for i in range(16))
    for i in range(16):
        want = before[f"{i}.weight"] + sum((s.deltas[str(i)]["up"] @ s.deltas[str(i)]["down"]) * s.plan.strength
                                           for s in staged)
        assert torch.allclose(model[i].weight, want, atol=1e-5)
