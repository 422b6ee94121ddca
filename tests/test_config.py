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


# ------------------------------------------------------------------------------- text is text

BASE = {"model": {"path": "m"}, "prompt": "p"}


@pytest.mark.parametrize("text", [
    "a fox #1 in the snow", "a fox: running", "yes", "no", "null", "3", '"quoted"', "'single'", " spaced out ",
    "...", "---", "[not, a, list]", "{not: a map}", "a fox ${oc.env:HOME}", "???", "back\\slash \\${x}", "~", "%TAG"])
def test_string_keys_on_the_command_line_are_taken_whole(text):
    """KEY=VALUE of a string-typed key is that text, whole: nothing YAML reads as a comment, a bool, a
    document marker or a reference; the same for paths and names."""
    path = "out/" + text.replace("{", "{{").replace("}", "}}") + ".mp4"     # braces are placeholders there
    cfg = load_config(BASE, [f"prompt={text}", f"negative_prompt={text}", f"output.path={path}",
                             f"image={text}", f"model.path={text}", f"guard.engine_cache={text}"])
    assert cfg.prompt == cfg.negative_prompt == cfg.image == cfg.model.path == cfg.guard.engine_cache == text
    assert cfg.output.path == path


def test_an_empty_string_key_is_empty_not_null():
    with pytest.raises(ConfigError) as e:
        load_config(BASE, ["prompt="])
    assert e.value.problems == ['prompt: is empty; say what to render, e.g. prompt="a fox running in snow"']


def test_yaml_where_it_is_wanted_and_nothing_dropped():
    cfg = load_config(BASE, ["seed=3", "loras=[{path: a.safetensors, strength: 0.5}]", "image:=null",
                             "negative_prompt:=${prompt}", "guard.blocklists=[default, x.txt]"])
    assert (cfg.seed, cfg.loras[0].strength, cfg.image, cfg.negative_prompt) == (3, 0.5, None, "p")
    assert cfg.guard.blocklists == ["default", "x.txt"]
    with pytest.raises(ConfigError) as e:
        load_config(BASE, ["prompt:=a fox #1", "seed=3 # the good one", "seed="])
    assert e.value.problems == [
        "override 'prompt:=a fox #1': YAML would drop '#1' as a comment; quote the value or remove the comment",
        "override 'seed=3 # the good one': YAML would drop '# the good one' as a comment; quote the value or "
        "remove the comment",
        "override 'seed=' has no value; give one (or seed:=null for null)"]


def test_text_is_never_resolved_through_any_door(tmp_path, monkeypatch):
    """`${oc.env:...}` reaches a config only as text (an override, a preset's `\\${` escape, a dict, a
    RenderConfig, a queued job's stored payload), and stays that text however often it is reloaded."""
    from vidgen.queue.workflow import plan_single

    monkeypatch.setenv("VIDGEN_TEST_SECRET", "hunter2")
    text = "a fox ${oc.env:VIDGEN_TEST_SECRET} \\${oc.env:VIDGEN_TEST_SECRET} \\\\${x}"
    # OmegaConf's escape in YAML: `${` after n backslashes is written after 2n+1 of them
    escaped = "a fox \\${oc.env:VIDGEN_TEST_SECRET} \\\\\\${oc.env:VIDGEN_TEST_SECRET} \\\\\\\\\\${x}"
    preset = tmp_path / "p.yaml"
    preset.write_text(f"model: {{path: m}}\nprompt: '{escaped}'\n")
    monkeypatch.chdir(tmp_path)
    loaded = [load_config(preset), load_config(BASE, [f"prompt={text}"]), load_config({**BASE, "prompt": text}),
              load_config(BASE, {"prompt": text})]
    [job] = plan_single(preset, ["seed=1"])
    loaded += [load_config(loaded[0]), load_config(job.payload), load_config(load_config(job.payload))]
    file = tmp_path / "shown.yaml"
    file.write_text(to_yaml(loaded[0]))
    loaded.append(load_config(file))      # `vidgen config show` output, saved and loaded as a preset
    assert [c.prompt for c in loaded] == [text] * len(loaded)


@pytest.mark.parametrize("key, value, needle", [
    ("prompt", "a fox\x00", "prompt: contains a NUL character"),
    ("prompt", "a fox \udc80", "prompt: contains a lone surrogate"),
    ("output.path", "out/x\x00.mp4", "output.path: contains a NUL character"),
    ("negative_prompt", "\ud800", "negative_prompt: contains a lone surrogate"),
    ("guard.blocklists", ["default", "x\x00"], "guard.blocklists[1]: contains a NUL character"),
    ("loras", [{"path": "a\udcff.safetensors"}], "loras[0].path: contains a lone surrogate"),
])
def test_text_no_file_can_hold_is_refused_at_validation(key, value, needle):
    with pytest.raises(ConfigError) as e:
        load_config(BASE, {key: value})
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith(needle), e.value.problems
    str(e.value).encode("utf-8")       # the message itself can be printed


def test_keywords_after_a_list_of_overrides_stay_values():
    """vidgen.render(cfg, overrides=[...], prompt=...): the keyword is a value, applied after the list, not
    turned into a KEY=VALUE string (whose quotes would now be the prompt's)."""
    from vidgen.pipeline import _merge_overrides

    merged = _merge_overrides(["seed=2", "prompt=first"], {"prompt": 'a "fox" #1', "sampling.steps": 3})
    cfg = load_config(BASE, merged)
    assert (cfg.prompt, cfg.seed, cfg.sampling.steps) == ('a "fox" #1', 2, 3)
