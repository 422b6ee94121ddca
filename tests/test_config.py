"""Config schema, preset inheritance, overrides, and every shipped preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from vidgen.config import RenderConfig, digest
from vidgen.presets import load_config, to_yaml
from vidgen.errors import ConfigError
from vidgen.loading import inspect_model
from vidgen.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p for p in (ROOT / "configs").glob("*.yaml") if not p.name.endswith("base.yaml"))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_shipped_preset_validates(preset):
    cfg = load_config(preset, ["prompt=a fox"])
    assert isinstance(cfg, RenderConfig)
    assert preset.read_text().startswith("#"), "each preset opens with a comment showing its command"
    model = ROOT / cfg.model.path
    if model.is_dir():  # presets for local sample models are checked against the model too
        preflight(load_config(preset, [f"model.path={model}", "output.path=/tmp/x.mp4", "output.overwrite=true"]))


def test_defaults_merge_in_order_then_file_then_overrides(tmp_path):
    (tmp_path / "a.yaml").write_text("fps: 10\nsampling: {steps: 5, shift: 2.0}\nmodel: {path: m}\n")
    (tmp_path / "b.yaml").write_text("fps: 20\nsampling: {steps: 6}\n")
    (tmp_path / "c.yaml").write_text("defaults: [a.yaml, b.yaml]\nprompt: hi\nsampling: {guidance_scale: 2}\n")
    cfg = load_config(tmp_path / "c.yaml", ["sampling.steps=9"])
    assert (cfg.fps, cfg.sampling.steps, cfg.sampling.shift, cfg.sampling.guidance_scale) == (20, 9, 2.0, 2.0)


def test_defaults_cycle_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("defaults: [b.yaml]\n")
    (tmp_path / "b.yaml").write_text("defaults: [a.yaml]\n")
    with pytest.raises(ConfigError, match="includes itself"):
        load_config(tmp_path / "a.yaml")


def test_all_problems_at_once():
    with pytest.raises(ConfigError) as e:
        load_config({"model": {"path": "m", "devcie": "cpu"}, "sampling": {"steps": "x", "solver": "ddim"},
                     "size": "100x100", "num_frames": 8, "output": {"crf": -1, "path": "o/{nope}.mp4"}})
    problems = e.value.problems
    for needle in ("model.devcie", "sampling.steps", "sampling.solver", "size", "num_frames", "output.crf",
                   "output.path", "prompt: is required"):
        assert any(p.startswith(needle) for p in problems), (needle, problems)
    assert len(problems) == 8


def test_wrong_types_named_in_the_configs_order():
    """Values of one level are type-checked in one merge; where it fails, each bad value is named, in
    the order the config gives them, between the problems around it, and the good ones are kept."""
    with pytest.raises(ConfigError) as e:
        load_config({"model": {"path": "m"}, "num_frames": "lots", "prompt": "p",
                     "sampling": {"steps": "many", "shift": 3.0, "guidance_scale": "x"}, "fps": [1], "sede": 2, "seed": "s"})
    assert [p.split(":")[0] for p in e.value.problems] == ["num_frames", "sampling.steps", "sampling.guidance_scale",
                                                            "fps", "sede", "seed"], e.value.problems


def test_api_overrides_nested_and_dotted():
    cfg = load_config({"model": {"path": "m"}, "prompt": "p"}, {"sampling": {"steps": 3}, "output.crf": 20,
                                                                   "seed": 5})
    assert (cfg.sampling.steps, cfg.output.crf, cfg.seed) == (3, 20, 5)


def test_size_spellings_and_digest():
    a = load_config({"model": {"path": "m"}, "prompt": "p", "size": "1280*720", "seed": 1})
    b = load_config({"model": {"path": "m"}, "prompt": "p", "size": "1280x720", "seed": 1})
    assert (a.width, a.height) == (1280, 720)
    assert a.size == b.size == "1280x720" and digest(a) == digest(b)   # one config, however it is spelled
    assert digest(b) == digest(load_config(to_yaml_dict(b)))


def to_yaml_dict(cfg):
    import yaml

    return yaml.safe_load(to_yaml(cfg))


def test_model_aware_checks(tiny_model):
    info = inspect_model(tiny_model("wan2.2-ti2v-5b"))
    cfg = load_config({"model": {"path": str(info.path), "variant": "wan2.1-t2v"}, "prompt": "p", "size": "48x48",
                       "sampling": {"boundary": 0.5}, "output": {"path": "/tmp/vidgen-test.mp4", "overwrite": True}})
    with pytest.raises(ConfigError) as e:
        preflight(cfg, info)
    text = str(e.value)
    assert "does not match the folder, which holds 'wan2.2-ti2v-5b'" in text
    assert "multiple of 32" in text and "boundary" in text
