"""Hostile model folders, latents files, checkpoints and videos: one error line, exit 2, nothing changed.

Damaged model-folder JSON and weights are found by inspect_model before any weights load, every
problem at once; a folder carrying code is refused and its code never runs; latents files and
checkpoints with missing or malformed metadata or tensors say they are damaged; `--resume`
without a path finds this render's checkpoint among others; `guard check` on a file without
video says so.
"""

from __future__ import annotations

import builtins
import json
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save as st_save

import vidgen
from vidgen import resume
from vidgen.cli import main
from vidgen.config import to_dict
from vidgen.presets import load_config
from vidgen.errors import InputError, ModelLoadError
from vidgen.loading import inspect_model, load_components
from vidgen.records import check_safetensors
from vidgen.residency import Residency
from vidgen.sampling import SamplerState

from hostile import assert_refused, untouched

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _copy(tiny_model, tmp_path: Path, variant: str = "wan2.1-t2v", name: str = "model") -> Path:
    folder = tmp_path / name
    shutil.copytree(tiny_model(variant), folder)
    return folder


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _cfg_file(tmp_path: Path, cfg: dict, name: str = "cfg.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _cli(capsys, argv) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def _raw_safetensors(header, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


# ------------------------------------------------------------------------------ model folder JSON

def _write(rel: str, text: str):
    return lambda root: (root / rel).write_text(text)


def _fields(root: Path) -> None:
    _edit_json(root / "transformer" / "config.json", patch_size=[1, 0, 2], in_channels="16", rope_max_seq_len=0)
    _edit_json(root / "vae" / "config.json", z_dim=-16, scale_factor_spatial=0, scale_factor_temporal=2.5)
    _edit_json(root / "scheduler" / "scheduler_config.json", num_train_timesteps=True, flow_shift=-1)
    _edit_json(root / "model_index.json", boundary_ratio=1.5, expand_timesteps="yes")


def _not_safetensors(root: Path) -> None:
    (root / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"<html>404 Not Found</html>" * 40)


def _truncated(root: Path) -> None:
    path = root / "vae" / "diffusion_pytorch_model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


def _bad_shards(root: Path) -> None:
    (root / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "diffusion_pytorch_model-00001-of-00002.safetensors",
                                        "b": "../../outside.safetensors"}}))
    (root / "text_encoder" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["x"]}))


MODEL_DAMAGE = {
    "index is a list": (_write("model_index.json", "[1, 2]"), ["model_index.json holds an array, not a JSON object"]),
    "index is not JSON": (_write("model_index.json", '{"transformer": '), ["model_index.json is not valid JSON"]),
    "entry of the wrong shape": (lambda r: _edit_json(r / "model_index.json", transformer="WanTransformer3DModel",
                                                      vae=["diffusers"]),
                                 ["2 problems", "model_index.json: transformer is 'WanTransformer3DModel' (expected "
                                  "[\"diffusers\", \"WanTransformer3DModel\"]", "model_index.json: vae is [\"diffusers\"] (expected"]),
    "config is a list": (_write("transformer/config.json", "[16, 16]"),
                         ["transformer/config.json holds an array, not a JSON object"]),
    "every bad field at once": (_fields, [
        "10 problems", "transformer/config.json: patch_size is [1, 0, 2] (expected 3 integers, each in 1..16)",
        "transformer/config.json: in_channels is '16' (expected an integer in 1..4096)",
        "transformer/config.json: rope_max_seq_len is 0", "vae/config.json: z_dim is -16",
        "vae/config.json: scale_factor_spatial is 0", "vae/config.json: scale_factor_temporal is 2.5",
        "scheduler/scheduler_config.json: num_train_timesteps is true (expected an integer",
        "scheduler/scheduler_config.json: flow_shift is -1 (expected a number > 0)",
        "model_index.json: boundary_ratio is 1.5 (expected a number in (0, 1))",
        "model_index.json: expand_timesteps is 'yes' (expected true or false)"]),
    "patch_size of the wrong length": (lambda r: _edit_json(r / "transformer" / "config.json", patch_size=[2, 2]),
                                       ["patch_size is [2, 2] (expected 3 integers"]),
    "html saved as weights": (_not_safetensors, ["transformer/diffusion_pytorch_model.safetensors is not a "
                                                 "safetensors file", "replace it with the original file"]),
    "truncated weights": (_truncated, ["vae/diffusion_pytorch_model.safetensors has a damaged safetensors header"]),
    "bad shard indexes": (_bad_shards, [
        "3 problems", "weight_map names 1 file(s) outside the folder (../../outside.safetensors)",
        "weight_map names 1 safetensors file(s) that are not in the folder "
        "(diffusion_pytorch_model-00001-of-00002.safetensors)",
        "text_encoder/model.safetensors.index.json: weight_map is [\"x\"] (expected an object"]),
}


@pytest.mark.parametrize("case", list(MODEL_DAMAGE))
def test_damaged_model_folder_is_refused_before_any_weights_load(capsys, base_cfg, tiny_model, tmp_path,
                                                                 monkeypatch, case):
    import vidgen.pipeline as pl

    damage, needles = MODEL_DAMAGE[case]
    folder = _copy(tiny_model, tmp_path)
    damage(folder)
    for name in ("load_components", "load_vae"):
        monkeypatch.setattr(pl, name, lambda *a, **k: pytest.fail("weights were loaded"))
    cfg = _cfg_file(tmp_path, base_cfg(model={"path": str(folder), "device": "cpu"}))
    with untouched(tmp_path):
        code, err = _cli(capsys, ["render", cfg, "-q"])
    line = assert_refused(code, err, f"model folder {folder} is invalid", *needles)
    assert "<html>" not in line and "Not Found" not in line         # no file content in the message


def test_field_readers_check_type_and_range():
    from vidgen import records as R

    d = {"n": 3, "flag": True, "one": 1, "nan": float("nan"), "p": [1, 2, 2], "s": "unipc", "null": None}
    problems: list[str] = []
    assert R.int_field(d, "n", 0, 1, 5, "c", problems) == 3 and R.int_field(d, "absent", 7, 1, 5, "c", problems) == 7
    assert R.int_field(d, "null", 7, 1, 5, "c", problems) == 7 and problems == []
    assert R.int_field(d, "flag", 7, 0, 5, "c", problems) == 7          # JSON true is not an integer
    assert R.bool_field(d, "one", False, "c", problems) is False        # nor is 1 a boolean
    assert R.float_field(d, "nan", 1.0, "c", problems, above=0) == 1.0
    assert R.int_tuple_field(d, "p", (1, 1, 1), 3, 1, 4, "c", problems) == (1, 2, 2)
    assert R.choice_field(d, "s", R.REQUIRED, ("unipc", "euler"), "c", problems) == "unipc"
    assert R.int_field(d, "gone", R.REQUIRED, 0, None, "c", problems) is None
    assert problems == ["c: flag is true (expected an integer in 0..5)", "c: one is 1 (expected true or false)",
                        "c: nan is NaN (expected a number > 0)", "c: gone is missing"]
    assert R.describe("x" * 500) == "a string of 500 characters" and R.describe("line\nbreak") == "a string of 10 characters"


def test_every_tiny_variant_still_inspects(tiny_model):
    for variant in ("wan2.1-t2v", "wan2.2-t2v-a14b", "wan2.2-i2v-a14b", "wan2.2-ti2v-5b"):
        info = inspect_model(tiny_model(variant))
        assert info.variant == variant and info.rope_max_seq_len == 32


def test_check_safetensors_agrees_with_the_library(tmp_path):
    good = st_save({"a": torch.zeros(3), "b": torch.ones(2, 2, dtype=torch.float16)}, metadata={"k": "v"})
    header_len = int.from_bytes(good[:8], "little")
    header, data = json.loads(good[8:8 + header_len]), good[8 + header_len:]
    a, b = header["a"], header["b"]
    cases = {
        "too short": (b"\x01\x02", "only 2 bytes"),
        "huge length": ((2**40).to_bytes(8, "little") + b"{}", "header of 1099511627776 bytes"),
        "header is a list": (_raw_safetensors([1]), "holds an array"),
        "metadata not str": (_raw_safetensors({"__metadata__": {"k": 1}, "a": a, "b": b}, data), "__metadata__"),
        "unknown dtype": (_raw_safetensors({"a": {**a, "dtype": "F31"}, "b": b}, data), "dtype 'F31'"),
        "negative shape": (_raw_safetensors({"a": {**a, "shape": [-3]}, "b": b}, data), "shape [-3]"),
        "offsets past the end": (_raw_safetensors({"a": a, "b": {**b, "data_offsets": [12, 999]}}, data),
                                 "data_offsets [12, 999]"),
        "size mismatch": (_raw_safetensors({"a": {**a, "shape": [2]}, "b": b}, data), "not what a F32 tensor"),
        "gap": (_raw_safetensors({"a": {**a, "data_offsets": [8, 20]}, "b": {**b, "data_offsets": [20, 28]}},
                                 data + bytes(8)), "does not start where"),
        "trailing bytes": (good + bytes(4), "cover 20 of the file's 24 data bytes"),
    }
    path = tmp_path / "x.safetensors"
    path.write_bytes(good)
    assert check_safetensors(path) is None
    for name, (raw, needle) in cases.items():
        path.write_bytes(raw)
        problem = check_safetensors(path)
        assert problem and needle in problem, (name, problem)
        with pytest.raises(Exception):          # the library refuses each one too: the checks match
            with safe_open(str(path), framework="pt") as f:
                [f.get_tensor(k) for k in f.keys()]


# ------------------------------------------------------------------------------ the rotary table

def test_limit_problems_name_the_largest_valid_value(tiny_model, tmp_path):
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    info = inspect_model(tiny_model())          # rope_max_seq_len 32, VAE 8x / 4x, patch (1, 2, 2)
    assert info.limit_problems(512, 512, 125) == []
    assert info.limit_problems(64, 64, 129) == [
        "num_frames: 129 is more than this model's rotary table allows (rope_max_seq_len 32 -> at most 125 frames)"]
    assert info.limit_problems(528, 64, 5) == [
        "size: 528x64 is more than this model's rotary table allows (rope_max_seq_len 32 -> at most 512x512)"]
    assert len(info.limit_problems(64, 528, 129)) == 2
    # The limits are diffusers' own: its rotary embedding takes the largest grid and fails one step past it.
    rope = WanRotaryPosEmbed(16, info.patch_size, info.rope_max_seq_len)
    for (w, h, n), fits in [((512, 512, 125), True), ((64, 64, 129), False), ((528, 64, 5), False),
                            ((64, 528, 5), False)]:
        grid = info.latent_grid(w, h, n)
        if fits:
            rope(torch.zeros(1, 16, *grid))
        else:
            with pytest.raises(RuntimeError):
                rope(torch.zeros(1, 16, *grid))

    folder = _copy(tiny_model, tmp_path)
    _edit_json(folder / "transformer" / "config.json", rope_max_seq_len=8)
    small = inspect_model(folder)
    assert small.limit_problems(128, 128, 29) == []
    assert ["at most 29 frames" in p or "at most 128x128" in p for p in small.limit_problems(144, 64, 33)] == [True] * 2
    conf = json.loads((folder / "transformer" / "config.json").read_text())
    del conf["rope_max_seq_len"]                 # diffusers' default, 1024
    (folder / "transformer" / "config.json").write_text(json.dumps(conf))
    assert inspect_model(folder).limit_problems(64, 64, 4097) == [
        "num_frames: 4097 is more than this model's rotary table allows (rope_max_seq_len 1024 -> at most 4093 frames)"]


def test_render_past_the_rotary_table_is_refused(capsys, base_cfg, tmp_path):
    cfg = _cfg_file(tmp_path, base_cfg())
    with untouched(tmp_path):
        code, err = _cli(capsys, ["render", cfg, "num_frames=129", "-q"])
    assert_refused(code, err, "num_frames: 129", "at most 125 frames")


# ------------------------------------------------------------------------------ custom code

EVIL_MODULE = """from pathlib import Path
Path({marker!r}).write_text("the model folder's code ran")
from transformers import PreTrainedTokenizerFast
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def _make_evil(folder: Path, marker: Path) -> None:
    """A tokenizer whose config makes transformers import tokenization_evil.py (after asking y/N)."""
    (folder / "tokenizer" / "tokenization_evil.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    _edit_json(folder / "tokenizer" / "tokenizer_config.json", tokenizer_class="EvilTokenizer",
               auto_map={"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]})


def test_custom_code_is_refused_and_never_runs(capsys, base_cfg, tiny_model, tmp_path):
    folder, marker = _copy(tiny_model, tmp_path), tmp_path / "MARKER"
    _make_evil(folder, marker)
    cfg = _cfg_file(tmp_path, base_cfg(model={"path": str(folder), "device": "cpu"}))
    with untouched(tmp_path):
        code, err = _cli(capsys, ["render", cfg, "-q"])
    assert_refused(code, err, f"model folder {folder} holds custom code (tokenizer/tokenization_evil.py; "
                              "tokenizer/tokenizer_config.json's 'auto_map' entry)", "vidgen never runs code from a "
                              "model folder: remove them")
    assert not marker.exists()


CODE_PLACES = {
    "a .py file anywhere": (lambda r: (r / "vae" / "sub").mkdir() or (r / "vae" / "sub" / "x.py").write_text(""),
                            "(vae/sub/x.py)"),
    "auto_map in a config": (lambda r: _edit_json(r / "transformer" / "config.json", auto_map={"AutoModel": "m.M"}),
                             "(transformer/config.json's 'auto_map' entry)"),
    "custom_pipeline": (lambda r: _edit_json(r / "model_index.json", custom_pipeline="my_pipeline"),
                        "(model_index.json's 'custom_pipeline' entry)"),
    "auto_map spelled with an escape": (
        lambda r: (r / "tokenizer" / "tokenizer_config.json").write_text('{"auto\\u005fmap": {"AutoTokenizer": "x.Y"}}'),
        "(tokenizer/tokenizer_config.json's 'auto_map' entry)"),
}


@pytest.mark.parametrize("case", list(CODE_PLACES))
def test_code_anywhere_in_the_folder_is_refused(tiny_model, tmp_path, case):
    make, needle = CODE_PLACES[case]
    folder = _copy(tiny_model, tmp_path)
    make(folder)
    with pytest.raises(ModelLoadError, match="holds custom code") as e:
        inspect_model(folder)
    assert needle in str(e.value) and "remove it" in str(e.value)


def test_load_components_never_prompts_or_runs_folder_code(tiny_model, tmp_path, monkeypatch):
    """Even past inspect_model, transformers is told not to trust the folder: it refuses, never asks."""
    from transformers import AutoTokenizer

    folder, marker = _copy(tiny_model, tmp_path), tmp_path / "MARKER"
    info = inspect_model(folder)                 # inspected while clean, then made hostile
    _make_evil(folder, marker)
    asked = []
    monkeypatch.setattr(builtins, "input", lambda *a: asked.append(a) or "n")
    # The premise: left to its default, transformers would ask to run the folder's code.
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoTokenizer.from_pretrained(folder / "tokenizer", local_files_only=True)
    assert asked and not marker.exists()
    monkeypatch.setattr(builtins, "input", lambda *a: pytest.fail("transformers asked to run the folder's code"))
    with pytest.raises(ModelLoadError, match=f"cannot load {folder}/tokenizer: .*custom code"):
        load_components(info, Residency(None, torch.device("cpu")), torch.float32, torch.float32)
    assert not marker.exists()


# ------------------------------------------------------------------------------ latents files and checkpoints

LATENTS_FORMAT = "vidgen-latents-1"


def _latents_file(cfg: dict, **meta_changes) -> bytes:
    meta = {"format": LATENTS_FORMAT, "config": json.dumps(to_dict(load_config(cfg)))}
    meta.update(meta_changes)
    return st_save({"latents": torch.zeros(1, 16, 3, 8, 8)}, metadata={k: v for k, v in meta.items() if v is not None})


LATENTS_DAMAGE = {
    "text, not safetensors": (lambda cfg: b"these are not the latents you are looking for\n" * 3,
                              ["cannot read", "is not a safetensors file"]),
    "no config": (lambda cfg: _latents_file(cfg, config=None), ["is damaged: its metadata has no 'config' entry"]),
    "config not JSON": (lambda cfg: _latents_file(cfg, config="{'seed': 7"), ["its 'config' metadata is not valid JSON"]),
    "config a list": (lambda cfg: _latents_file(cfg, config="[7]"), ["'config' metadata holds an array"]),
    "other format": (lambda cfg: _latents_file(cfg, format="something-else"), ["is not a vidgen latents file"]),
    "no latents tensor": (lambda cfg: st_save({"x": torch.zeros(1)}, metadata={
        "format": LATENTS_FORMAT, "config": json.dumps(to_dict(load_config(cfg)))}), ["no 'latents' tensor"]),
}


@pytest.mark.parametrize("case", list(LATENTS_DAMAGE))
def test_damaged_latents_file_is_refused(capsys, base_cfg, tmp_path, case):
    make, needles = LATENTS_DAMAGE[case]
    bad = tmp_path / "clip.latents.safetensors"
    bad.write_bytes(make(base_cfg()))
    with untouched(tmp_path):
        code, err = _cli(capsys, ["decode", str(bad), "-q"])
    line = assert_refused(code, err, str(bad), *needles)
    assert "looking for" not in line


def _state(shape=(1, 16, 3, 8, 8), **changes) -> SamplerState:
    x = torch.zeros(shape)
    args = dict(step=2, latents=x, history={"x0_prev": x.clone(), "last_sample": x.clone(), "lower_order_nums": 2,
                                            "this_order": 2},
                solver="unipc", steps=4, shift=None, schedule="diffusers", schedule_digest="0123456789abcdef")
    args.update(changes)
    return SamplerState(**args)


def _checkpoint_file(cfg: dict, sampler: SamplerState | None = None, *, edit_tensors=None, **meta_changes) -> bytes:
    tensors, state_meta = (sampler or _state()).to_tensors()
    if edit_tensors:
        edit_tensors(tensors)
    meta = {"format": resume.FORMAT, "state": json.dumps(state_meta),
            "config": json.dumps(to_dict(load_config(cfg)))}
    meta.update(meta_changes)
    return st_save(tensors, metadata={k: v for k, v in meta.items() if v is not None})


CHECKPOINT_DAMAGE = {
    "zeros, not safetensors": (lambda c: bytes(64), ["cannot read", "is not a safetensors file"]),
    "other format": (lambda c: _checkpoint_file(c, format="vidgen-latents-1"), ["is not a vidgen checkpoint"]),
    "no config, no state": (lambda c: _checkpoint_file(c, config=None, state=None), [
        "is damaged (2 problems: its metadata has no 'config' entry; its metadata has no 'state' entry)"]),
    "config not JSON": (lambda c: _checkpoint_file(c, config="nope"), ["its 'config' metadata is not valid JSON"]),
    "state a list": (lambda c: _checkpoint_file(c, state="[2, 4]"), ["its 'state' metadata holds an array"]),
    "state empty": (lambda c: _checkpoint_file(c, state="{}"), [
        "5 problems: state: steps is missing; state: step is missing; state: solver is missing; state: schedule "
        "is missing; state: shift is missing"]),
    "state of the wrong types": (lambda c: _checkpoint_file(c, state=json.dumps(
        {"step": "2", "steps": 0, "solver": "rk4", "kind": "wan", "history": []})), [
        "state: steps is 0 (expected an integer >= 1)", "state: step is '2'", "state: solver is 'rk4'",
        "state: shift is missing", "state: history is [] (expected an object"]),
    "step past the end": (lambda c: _checkpoint_file(c, _state(step=9)), ["state: step is 9 (expected an integer in 0..4)"]),
    "no latents": (lambda c: _checkpoint_file(c, edit_tensors=lambda t: t.pop("latents")), ["it has no 'latents' tensor"]),
    "integer latents": (lambda c: _checkpoint_file(c, _state(latents=torch.zeros(1, 16, 3, 8, 8, dtype=torch.int64))),
                        ["its latents are a 5-d int64 tensor"]),
    "history of another shape": (lambda c: _checkpoint_file(c, edit_tensors=lambda t: t.update(
        {"history.x0_prev": torch.zeros(3)})), ["tensor 'history.x0_prev' has shape [3]"]),
    "history missing": (lambda c: _checkpoint_file(c, _state(history={})), [
        "its unipc history lacks x0_prev, last_sample, lower_order_nums, this_order"]),
    "a stray tensor": (lambda c: _checkpoint_file(c, edit_tensors=lambda t: t.update({"evil": torch.zeros(1)})),
                       ["tensor 'evil' is not part of a sampler state"]),
    "latents that do not fit the render": (lambda c: _checkpoint_file(c, _state((1, 16, 3, 4, 4))), [
        "its latents have shape [1, 16, 3, 4, 4], but its settings need [1, 16, 3, 8, 8]"]),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_DAMAGE))
def test_damaged_checkpoint_is_refused(capsys, base_cfg, tmp_path, case):
    make, needles = CHECKPOINT_DAMAGE[case]
    cfg = base_cfg()
    bad = tmp_path / "out" / "clip.resume.safetensors"
    bad.parent.mkdir()
    bad.write_bytes(make(cfg))
    cfg_path = _cfg_file(tmp_path, cfg)
    with untouched(tmp_path):
        code, err = _cli(capsys, ["render", cfg_path, f"--resume={bad}", "-q"])
    assert_refused(code, err, str(bad), *needles)


def test_a_sound_checkpoint_built_the_same_way_is_accepted(base_cfg, tmp_path):
    """The control for the cases above: only the damage makes them fail."""
    cfg = base_cfg()
    good = tmp_path / "good.resume.safetensors"
    good.write_bytes(_checkpoint_file(cfg))
    resumed, state = resume.resume_from(load_config(cfg), good)
    assert state.step == 2 and state.history["this_order"] == 2 and resumed.seed == 7


def test_from_tensors_names_its_source(base_cfg):
    tensors, meta = _state().to_tensors()
    with pytest.raises(InputError, match=r"^sampler state is damaged: it has no 'latents' tensor; save the state"):
        SamplerState.from_tensors({k: v for k, v in tensors.items() if k != "latents"}, meta)
    with pytest.raises(InputError, match=r"^checkpoint 'x' is damaged: its state is not valid JSON"):
        SamplerState.from_tensors(tensors, "{", source="checkpoint 'x'")


# ------------------------------------------------------------------------------ --resume without a path

def _stop_at(step: int):
    def callback(p):
        if p.stage == "denoise" and p.step == step:
            raise KeyboardInterrupt
    return callback


def _interrupted(cfg: dict) -> None:
    with pytest.raises(KeyboardInterrupt):
        vidgen.render(cfg, callback=_stop_at(2))


SAMPLING = {"steps": 4, "checkpoint_every": 1, "schedule": "wan", "shift": 3.0}


def test_has_placeholders():
    from vidgen.resume import has_placeholders

    assert has_placeholders("out/{seed}.mp4") and has_placeholders("{time}-{prompt}.mp4")
    assert not has_placeholders("out/clip.mp4") and not has_placeholders("out/{{seed}}.mp4")
    assert not has_placeholders("a{{b}}c/{{{{x}}}}.mp4") and has_placeholders("a{{{seed}}}.mp4")
    assert has_placeholders("out/{.mp4")           # malformed: cannot name one file


def test_resume_finds_this_renders_checkpoint_among_others(base_cfg, tmp_path, caplog):
    out = tmp_path / "out"
    a = base_cfg(sampling=SAMPLING, output={"path": str(out / "a.mp4")})
    b = base_cfg(sampling=SAMPLING, prompt="a blue square moving up", output={"path": str(out / "b.mp4")})
    _interrupted(a)
    _interrupted(b)                              # newer: the old `--resume` picked it and refused
    result = vidgen.render(a, resume=True)
    assert result.path == out / "a.mp4" and not (out / "a.resume.safetensors").exists()
    assert (out / "b.resume.safetensors").exists()

    # With placeholders the newest checkpoint whose settings match wins; a damaged one is skipped.
    seeded = base_cfg(seed=None, sampling=SAMPLING, output={"path": str(out / "{seed}.mp4")})
    _interrupted(seeded)
    (out / "zz-damaged.resume.safetensors").write_bytes(b"not a checkpoint")
    caplog.set_level("WARNING", logger="vidgen")
    assert resume.find(load_config(seeded)).name not in ("b.resume.safetensors", "zz-damaged.resume.safetensors")
    skipped = [r.getMessage() for r in caplog.records if "skipping a damaged checkpoint" in r.getMessage()]
    assert len(skipped) == 1 and "zz-damaged.resume.safetensors" in skipped[0]
    result = vidgen.render(seeded, resume=True)
    assert result.path.parent == out and result.path.stem.isdigit()

    other = base_cfg(seed=None, prompt="a green tree", sampling=SAMPLING, output={"path": str(out / "{seed}.mp4")})
    with pytest.raises(InputError, match=r"none of the 2 checkpoints in .* continues this render \(1 made with "
                                         r"other settings, 1 damaged\)"):
        resume.find(load_config(other))


def test_resume_with_literal_braces_in_the_output_path(base_cfg, tmp_path):
    cfg = base_cfg(sampling=SAMPLING, output={"path": str(tmp_path / "{{draft}}.mp4")})
    _interrupted(cfg)
    assert resume.find(load_config(cfg)) == tmp_path / "{draft}.resume.safetensors"
    assert vidgen.render(cfg, resume=True).path == tmp_path / "{draft}.mp4"


# ------------------------------------------------------------------------------ guard check on non-videos

def _audio_only(path: Path) -> Path:
    import av
    import numpy as np

    with av.open(str(path), "w") as c:
        stream = c.add_stream("aac", rate=8000)
        stream.layout = "mono"
        for i in range(4):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 8000, i * 1024
            c.mux(stream.encode(frame))
        c.mux(stream.encode(None))
    return path


def _no_frames(path: Path, codec: str) -> Path:
    import av

    with av.open(str(path), "w") as c:
        stream = c.add_stream(codec, rate=8)
        stream.width = stream.height = 64
        stream.pix_fmt = "yuv420p"
        c.start_encoding()              # headers written, not one frame
    return path


def test_guard_check_on_files_without_video(capsys, tmp_path):
    from vidgen.io import read_video_info, video_fps
    from vidgen.errors import OutputError

    cases = {
        _audio_only(tmp_path / "voice.m4a"): "voice.m4a: it holds no video stream (audio only?)",
        _no_frames(tmp_path / "empty.mp4", "libx264"): "empty.mp4: it holds no video stream",  # mp4 drops the track
        _no_frames(tmp_path / "empty.avi", "mpeg4"): "empty.avi holds no video frames",        # avi keeps it
    }
    (tmp_path / "frames").mkdir()
    cases[tmp_path / "frames"] = "frames holds no video frames"
    with untouched(tmp_path):
        for path, needle in cases.items():
            code, err = _cli(capsys, ["guard", "check", str(path)])
            assert_refused(code, err, needle)
    assert video_fps(tmp_path / "voice.m4a") is None
    with pytest.raises(OutputError, match="holds no video stream"):
        read_video_info(tmp_path / "voice.m4a")


# ------------------------------------------------------------------------------ counts and sizes in range

def _sizes(root: Path) -> None:
    """One bad count or size in each component's JSON (and a second in the transformer's)."""
    _edit_json(root / "transformer" / "config.json", num_layers=1_000_000, attention_head_dim=0)
    _edit_json(root / "vae" / "config.json", num_res_blocks=10_000, dim_mult=[1, 2, 2, 0])
    _edit_json(root / "text_encoder" / "config.json", num_heads=0)
    _edit_json(root / "scheduler" / "scheduler_config.json", solver_order=1000)


SIZE_PROBLEMS = ["6 problems", "transformer/config.json: num_layers is 1000000 (expected an integer in 1..256)",
                 "transformer/config.json: attention_head_dim is 0 (expected an integer in 2..4096)",
                 "vae/config.json: num_res_blocks is 10000 (expected an integer in 1..16)",
                 "vae/config.json: dim_mult is [1, 2, 2, 0] (expected 1 to 8 integers, each in 1..64)",
                 "text_encoder/config.json: num_heads is 0 (expected an integer in 1..512)",
                 "scheduler/scheduler_config.json: solver_order is 1000 (expected an integer in 1..3)"]


@pytest.mark.parametrize("command", ["render", "plan"])
def test_counts_and_sizes_out_of_range_are_refused_before_anything_is_built(capsys, base_cfg, tiny_model, tmp_path,
                                                                          monkeypatch, command):
    import diffusers
    import vidgen.pipeline as pl

    folder = _copy(tiny_model, tmp_path)
    _sizes(folder)
    for name in ("load_components", "load_vae"):
        monkeypatch.setattr(pl, name, lambda *a, **k: pytest.fail("weights were loaded"))
    # nothing is built from the bad JSON, not even on the meta device (a million blocks took minutes)
    monkeypatch.setattr(diffusers.WanTransformer3DModel, "from_config", lambda *a, **k: pytest.fail("built"))
    cfg = _cfg_file(tmp_path, base_cfg(model={"path": str(folder), "device": "cpu"}))
    with untouched(tmp_path):
        code, err = _cli(capsys, [command, cfg] + (["-q"] if command == "render" else []))
    assert_refused(code, err, f"model folder {folder} is invalid", *SIZE_PROBLEMS)


def test_sizes_that_must_agree_and_single_files_from_a_folder(capsys, base_cfg, tiny_model, tmp_path):
    folder = _copy(tiny_model, tmp_path)
    _edit_json(folder / "transformer" / "config.json", attention_head_dim=201, num_attention_heads=500)
    _edit_json(folder / "vae" / "config.json", scale_factor_spatial=16, temperal_downsample=[True, True, True],
               latents_std=[1.0] * 15 + [0.0])
    with pytest.raises(ModelLoadError) as e:
        inspect_model(folder)
    for needle in ("attention_head_dim is 201 (expected an even integer)",
                   "num_attention_heads x attention_head_dim is 100500 (expected a width of at most 65536)",
                   "scale_factor_spatial is 16, but 3 downsampling stages x patch_size 1 compress 8x",
                   "scale_factor_temporal is 4, but temperal_downsample compresses 8x",
                   "latents_std is a list of 16 items (expected 16 finite numbers, each > 0"):
        assert needle in str(e.value), str(e.value)
    # A component given as a file beside a diffusers folder is checked against that folder's JSON:
    # the JSON is range-checked before a model is built from it.
    spare = _copy(tiny_model, tmp_path, name="spare")
    _edit_json(folder / "transformer" / "config.json", attention_head_dim=16, num_attention_heads=2, num_layers=0)
    cfg = _cfg_file(tmp_path, base_cfg(model={"path": str(folder), "device": "cpu",
                                              "transformer": str(spare / "transformer")}))
    code, err = _cli(capsys, ["render", cfg, "-q"])
    assert_refused(code, err, "transformer/config.json: num_layers is 0 (expected an integer in 1..256)")


def test_every_shipped_and_sample_json_is_in_range():
    from vidgen import schemas
    from vidgen.families import VARIANTS_DIR

    root = Path(__file__).resolve().parents[1]
    folders = [p for p in sorted(VARIANTS_DIR.iterdir()) if p.is_dir()] + \
              [p for p in sorted((root / "samples").iterdir()) if (p / "model_index.json").is_file()]
    assert len(folders) >= 7
    for folder in folders:
        problems: list[str] = []
        configs = schemas.read(folder, problems)
        assert {"transformer", "vae", "text_encoder", "scheduler"} <= set(configs), folder
        schemas.check(configs, problems)
        assert problems == [], folder
    # Wan2.1 I2V-14B's published transformer and CLIP ViT-H/14 image encoder are in range too.
    problems = []
    schemas.check({"transformer": {"num_layers": 40, "num_attention_heads": 40, "attention_head_dim": 128,
                                   "in_channels": 36, "out_channels": 16, "ffn_dim": 13824, "image_dim": 1280,
                                   "added_kv_proj_dim": 5120, "pos_embed_seq_len": 514, "text_dim": 4096},
                   "image_encoder": {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
                                     "num_attention_heads": 16, "image_size": 224, "patch_size": 14,
                                     "projection_dim": 1024}}, problems)
    assert problems == []


# ------------------------------------------------------------------------------ weights that are not float numbers

def _rewrite(path: Path, name: str, change) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    tensors[name] = change(tensors[name])
    save_file(tensors, str(path), metadata={"format": "pt"})


def _nan(t):
    t = t.clone()
    t.view(-1)[1] = float("nan")
    return t


def _inf(t):
    t = t.clone()
    t.view(-1)[0] = float("inf")
    return t


@pytest.mark.parametrize("where", ["folder", "file"])
def test_integer_weights_are_refused_at_the_header_check(capsys, base_cfg, tiny_model, tmp_path, monkeypatch, where):
    import vidgen.pipeline as pl

    folder = _copy(tiny_model, tmp_path)
    file = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    _rewrite(file, "blocks.0.attn1.to_q.weight", lambda t: (t * 100).to(torch.int64))
    model = {"path": str(folder), "device": "cpu"}
    if where == "file":             # the same tensors given as one file beside a folder of another copy
        other = _copy(tiny_model, tmp_path, name="other")
        single = tmp_path / "transformer.safetensors"
        shutil.copy(file, single)
        model = {"path": str(other), "device": "cpu", "transformer": str(single)}
        file = single
    for name in ("load_components", "load_vae"):
        monkeypatch.setattr(pl, name, lambda *a, **k: pytest.fail("weights were loaded"))
    cfg = _cfg_file(tmp_path, base_cfg(model=model))
    with untouched(tmp_path):
        code, err = _cli(capsys, ["render", cfg, "-q"])
    shown = str(file) if where == "file" else "transformer/diffusion_pytorch_model.safetensors"
    line = assert_refused(code, err, f"{shown}: 1 tensor(s) stored as integers, not floating point: "
                                     "'blocks.0.attn1.to_q.weight' (int64)", "replace the file with the original one")
    assert "speed" not in line


@pytest.mark.parametrize("case", ["nan-folder", "inf-file", "nan-vae", "nan-text-encoder"])
def test_non_finite_weights_are_named_at_load(capsys, base_cfg, tiny_model, tmp_path, case):
    folder = _copy(tiny_model, tmp_path)
    model = {"path": str(folder), "device": "cpu"}
    if case == "nan-folder":
        file, tensor = folder / "transformer" / "diffusion_pytorch_model.safetensors", "blocks.1.ffn.net.0.proj.weight"
        _rewrite(file, tensor, _nan)
    elif case == "inf-file":
        file, tensor = tmp_path / "transformer.safetensors", "proj_out.weight"
        shutil.copy(folder / "transformer" / "diffusion_pytorch_model.safetensors", file)
        _rewrite(file, tensor, _inf)
        model["transformer"] = str(file)
    elif case == "nan-vae":
        file, tensor = folder / "vae" / "diffusion_pytorch_model.safetensors", "decoder.conv_in.weight"
        _rewrite(file, tensor, _nan)
    else:
        file, tensor = folder / "text_encoder" / "model.safetensors", "encoder.block.0.layer.0.SelfAttention.q.weight"
        _rewrite(file, tensor, _nan)
    out = tmp_path / "out"
    cfg = _cfg_file(tmp_path, base_cfg(model=model, output={"path": str(out / "clip.mp4")}))
    with untouched(tmp_path / "model", tmp_path / "transformer.safetensors"):
        code, err = _cli(capsys, ["render", cfg, "-q"])
    line = assert_refused(code, err, f"{file}: tensor {tensor!r} holds NaN or infinite values",
                          "replace it with the original one")
    assert "speed" not in line and not (out.exists() and any(out.iterdir()))


# ------------------------------------------------------------------------------ paths that exist, but are not what is needed

@contextmanager
def _no_hang(seconds: int = 120):
    """Fail instead of hanging forever (opening a FIFO with no writer blocks)."""
    import signal

    def fail(*_):
        raise AssertionError("blocked: a FIFO or device was opened")
    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


PATH_KINDS = {
    "model.path is a weights file": ("model.path", "file", "is a file, not a folder; give a single weights file as "
                                                           "model.transformer"),
    "model.path is /dev/zero": ("model.path", "/dev/zero", "'/dev/zero' is a character device, not a folder"),
    "model.path is a FIFO": ("model.path", "fifo", "is a named pipe (FIFO), not a folder"),
    "model.transformer is a FIFO": ("model.transformer", "fifo", "model.transformer: {p!r} is a named pipe (FIFO), "
                                                                 "not a regular file"),
    "model.transformer is /dev/zero": ("model.transformer", "/dev/zero", "'/dev/zero' is a character device, not a "
                                                                         "regular file"),
    "model.tokenizer is a file": ("model.tokenizer", "file", "model.tokenizer: {p!r} is a file, not a folder"),
    "image is a FIFO": ("image", "fifo", "image: {p!r} is a named pipe (FIFO), not a regular file"),
    "image is a folder": ("image", "folder", "image: {p!r} is a folder, not a file"),
    "image is /dev/zero": ("image", "/dev/zero", "image: '/dev/zero' is a character device, not a regular file"),
}


@pytest.mark.parametrize("case", list(PATH_KINDS))
def test_paths_that_exist_are_named_for_what_they_are(capsys, base_cfg, tmp_path, monkeypatch, case):
    import os

    import vidgen.pipeline as pl

    key, kind, needle = PATH_KINDS[case]
    things = tmp_path / "things"
    things.mkdir()
    path = {"fifo": things / "fifo", "file": things / "weights.safetensors", "folder": things}.get(kind, Path(kind))
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "file":
        path.write_bytes(b"\0" * 16)
    for name in ("load_components", "load_vae"):
        monkeypatch.setattr(pl, name, lambda *a, **k: pytest.fail("weights were loaded"))
    cfg = base_cfg("wan2.2-ti2v-5b")                # takes an image
    section, _, field = key.partition(".")
    if field:
        cfg["model"] = {**cfg["model"], field: str(path)}
    else:
        cfg[section] = str(path)
    file = _cfg_file(tmp_path, cfg)
    with untouched(tmp_path / "out"), _no_hang():     # (a snapshot of `things` would read the FIFO)
        code, err = _cli(capsys, ["render", file, "-q"])
    line = assert_refused(code, err, needle.format(p=str(path)))
    assert "does not exist" not in line


def test_a_tokenizer_folder_with_code_is_refused_like_a_model_folder(capsys, base_cfg, tiny_model, tmp_path,
                                                                     monkeypatch):
    import vidgen.pipeline as pl

    folder, marker = _copy(tiny_model, tmp_path), tmp_path / "MARKER"
    _make_evil(folder, marker)
    tok = tmp_path / "tokenizer"
    shutil.move(folder / "tokenizer", tok)
    model = _copy(tiny_model, tmp_path, name="clean")
    for name in ("load_components", "load_vae"):
        monkeypatch.setattr(pl, name, lambda *a, **k: pytest.fail("weights were loaded"))
    cfg = _cfg_file(tmp_path, base_cfg(model={"path": str(model), "device": "cpu", "tokenizer": str(tok)}))
    with untouched(tmp_path):
        code, err = _cli(capsys, ["render", cfg, "-q"])
    line = assert_refused(code, err, f"model.tokenizer: {tok} holds custom code (tokenization_evil.py; "
                                     "tokenizer_config.json's 'auto_map' entry)", "vidgen never runs code")
    assert not marker.exists() and "trust_remote_code" not in line


SHIPPED_CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("wan*.yaml"))


@pytest.mark.parametrize("preset", [p.name for p in SHIPPED_CONFIGS if p.name != "wan-base.yaml"])
def test_a_preset_whose_model_is_not_here_names_only_a_published_repo(capsys, tmp_path, monkeypatch, preset):
    from vidgen.sources import PUBLISHED

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    path = load_config(str(Path(__file__).resolve().parents[1] / "configs" / preset), ["prompt=x"]).model.path
    code, err = _cli(capsys, ["render", str(Path(__file__).resolve().parents[1] / "configs" / preset), "prompt=x", "-q"])
    line = assert_refused(code, err, f"model.path: {path!r} is neither a local folder nor a repo in the Hugging Face "
                                     "cache", "vidgen never downloads")
    named = re.findall(r"hf download (\S+)", line)
    assert named and all(n in PUBLISHED for n in named), line
    assert f"--local-dir {path}`" in line            # downloaded where the preset looks for it


@pytest.mark.parametrize("inside", ["transformer/diffusion_pytorch_model.safetensors", "tokenizer/tokenizer.json",
                                    "vae/config.json"])
def test_a_fifo_inside_a_model_folder_is_never_opened(capsys, base_cfg, tiny_model, tmp_path, inside):
    import os

    folder = _copy(tiny_model, tmp_path)
    (folder / inside).unlink()
    os.mkfifo(folder / inside)
    cfg = _cfg_file(tmp_path, base_cfg(model={"path": str(folder), "device": "cpu"}))
    with untouched(tmp_path / "out"), _no_hang():
        code, err = _cli(capsys, ["render", cfg, "-q"])
    assert_refused(code, err, f"model folder {folder} holds an entry that is not a regular file ({inside} is "
                              "a named pipe (FIFO)); a model folder holds files and folders only")
    # and as a component given on its own, or in a tokenizer folder of its own
    tok = _copy(tiny_model, tmp_path, name="clean")
    (tok / "tokenizer" / "tokenizer.json").unlink()
    os.mkfifo(tok / "tokenizer" / "tokenizer.json")
    cfg = _cfg_file(tmp_path, base_cfg(model={"path": str(tiny_model()), "device": "cpu",
                                              "tokenizer": str(tok / "tokenizer")}), "tok.yaml")
    with _no_hang():
        code, err = _cli(capsys, ["render", cfg, "-q"])
    assert_refused(code, err, f"model.tokenizer: {tok / 'tokenizer'} holds entries that are not regular files "
                              "(tokenizer.json is a named pipe (FIFO))")


def test_the_non_finite_check_on_every_storage_dtype():
    from vidgen.weights import nonfinite

    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2):
        t = torch.randn(1000)
        assert not nonfinite(t.to(dtype)), dtype
        assert nonfinite(_nan(t).to(dtype)), dtype
        assert not nonfinite(torch.full((100_000,), 400.0).to(dtype)), dtype     # a sum past float16's range
    both = torch.randn(1000)
    both[3], both[4] = float("inf"), float("-inf")
    assert nonfinite(both) and nonfinite(both.to(torch.bfloat16)) and not nonfinite(torch.zeros(0))


def test_latents_and_lora_files_that_are_fifos_or_devices(capsys, base_cfg, tmp_path):
    import os

    fifo = tmp_path / "clip.latents.safetensors"
    os.mkfifo(fifo)
    with _no_hang():
        assert check_safetensors(fifo) == "is a named pipe (FIFO), not a regular file"
        for path, needle in ((fifo, "is a named pipe (FIFO), not a regular file"),
                             (Path("/dev/zero"), "is a character device, not a regular file"),
                             (tmp_path, "is a folder, not a file")):
            code, err = _cli(capsys, ["decode", str(path)])
            assert_refused(code, err, f"vidgen latents file {str(path)!r} {needle}")
        for argv in (["render", str(fifo)], ["config", "show", "/dev/zero"]):       # as a config file
            code, err = _cli(capsys, argv)
            assert_refused(code, err, f"config file {argv[-1]!r} is a ")
        cfg = _cfg_file(tmp_path, base_cfg(loras=[{"path": str(fifo)}]))
        code, err = _cli(capsys, ["render", cfg, "-q"])
    assert_refused(code, err, f"LoRA {fifo}: is a named pipe (FIFO), not a regular file")
