"""Hostile input to renders and configs: every refusal is exit 2, one line, no traceback, and leaves
every file as it was; nothing a user made is overwritten or deleted; configs read nothing outside
themselves. (Model folders and files read by vidgen: test_hostile_model.py; the queue:
test_hostile_queue.py and test_hostile_ledger.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from hostile import assert_refused, untouched
from PIL import Image

import vidgen
import vidgen.pipeline
import vidgen.preflight
from vidgen.cli import main
from vidgen.errors import ConfigError, OutputError
from vidgen.io import read_video_info

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _run(capsys, argv):
    if argv[0] in ("render", "decode"):     # no progress bars; -q goes after the overrides
        argv = [a for a in argv if a != "-q"] + ["-q"]
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.err


def _write(path: Path, cfg: dict) -> str:
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.fixture
def setup(base_cfg, tiny_model, tmp_path):
    """(config file, output path, folders to watch) for a tiny Wan2.1 render into tmp_path/out."""
    cfg = base_cfg()
    return _write(tmp_path / "cfg.yaml", cfg), Path(cfg["output"]["path"]), (tmp_path, tiny_model())


def _refused(capsys, watch, argv, *needles, exit_code=2) -> str:
    with untouched(*watch):
        code, err = _run(capsys, argv)
    return assert_refused(code, err, *needles, exit_code=exit_code)


# ------------------------------------------------------------------------------- 2. files beside the output

@pytest.mark.parametrize("beside, needle", [
    ("clip.latents.safetensors", "sampled latents of an earlier render"),
    ("clip.mp4.json", "already exists"),
    ("clip.resume.safetensors", "interrupted render's checkpoint"),
])
@pytest.mark.parametrize("save_latents", [True, False])
def test_files_beside_the_output_are_never_replaced(capsys, setup, beside, needle, save_latents):
    cfg, out, watch = setup
    out.parent.mkdir()
    (out.parent / beside).write_bytes(b"the user's file")
    _refused(capsys, watch, ["render", cfg, "-q", f"output.save_latents={str(save_latents).lower()}"], needle, beside)


def test_save_latents_false_deletes_only_what_it_wrote(capsys, setup):
    cfg, out, _ = setup
    code, err = _run(capsys, ["render", cfg, "-q", "output.save_latents=false"])
    assert code == 0, err
    assert sorted(os.listdir(out.parent)) == ["clip.mp4", "clip.mp4.json"]


# ------------------------------------------------------------------------------- 4. two renders, one path

def test_a_clip_that_appears_during_the_render_is_kept(setup):
    """Both renders passed the exists check; the later one keeps its clip under another name."""
    cfg, out, _ = setup

    def other_render_finishes(p):
        if p.stage == "decode" and p.step == 1:
            out.write_bytes(b"the other render's clip")

    with pytest.raises(OutputError, match=r"appeared while this ran.*kept as .*clip-2\.mp4"):
        vidgen.render(cfg, callback=other_render_finishes)
    assert out.read_bytes() == b"the other render's clip"
    assert read_video_info(out.with_name("clip-2.mp4"))["frames"] == 9
    assert json.loads(out.with_name("clip-2.mp4.json").read_text())["seed"] == 7
    assert (out.parent / "clip-2.latents.safetensors").exists()     # the sampling is kept too, beside its clip
    assert not (out.parent / "clip.latents.safetensors").exists()   # (the other render's name is left to it)


# ------------------------------------------------------------------------------- 5. frames folders

def test_overwrite_replaces_only_a_folder_of_frames(capsys, setup):
    cfg, out, watch = setup
    folder = out.parent / "frames"
    folder.mkdir(parents=True)
    (folder / "frame_00000.png").write_bytes(b"x")
    (folder / "thesis.tex").write_text("years of work")
    _refused(capsys, watch, ["render", cfg, "-q", f"output.path={folder}", "output.overwrite=true"],
             "holds more than an earlier render's frames (thesis.tex)")
    (folder / "thesis.tex").unlink()
    code, err = _run(capsys, ["render", cfg, "-q", f"output.path={folder}", "output.overwrite=true"])
    assert code == 0, err
    assert len(list(folder.glob("frame_*.png"))) == 9 and (out.parent / "frames.json").exists()


def test_output_that_is_a_folder_is_not_a_file_to_overwrite(capsys, setup):
    cfg, out, watch = setup
    out.mkdir(parents=True)
    _refused(capsys, watch, ["render", cfg, "-q", "output.overwrite=true"], "is a folder")


# ------------------------------------------------------------------------------- 8, 14. configs read nothing else

@pytest.mark.parametrize("where", ["file", "override", "defaults", "escaped twice"])
def test_resolvers_are_refused(capsys, setup, tmp_path, monkeypatch, where):
    cfg, out, watch = setup
    monkeypatch.setenv("VIDGEN_TEST_SECRET", "hunter2")
    argv = ["render", cfg, "-q"]
    if where == "override":
        argv.append("negative_prompt:=${oc.env:VIDGEN_TEST_SECRET}")     # := is YAML
    elif where == "escaped twice":      # \\${ is a backslash, then a live resolver (OmegaConf's grammar)
        argv.append("negative_prompt:=a \\\\${oc.env:VIDGEN_TEST_SECRET}")
    else:
        data = yaml.safe_load(Path(cfg).read_text())
        target = data
        if where == "defaults":
            _write(tmp_path / "base.yaml", {"negative_prompt": "${oc.env:VIDGEN_TEST_SECRET}"})
            data["defaults"] = ["base.yaml"]
            del data["negative_prompt"]
        else:
            target["prompt"] = "a fox ${oc.env:VIDGEN_TEST_SECRET}"
        _write(Path(cfg), data)
        argv = ["render", cfg, "-q"]
    line = _refused(capsys, watch, argv, "calls a resolver")
    assert "hunter2" not in line


@pytest.mark.parametrize("value, needle", [
    ("${nope}", "cannot fill in its ${...} reference"),
    ("${negative_prompt}", None),                           # a plain reference is fine
])
def test_references(capsys, setup, value, needle):
    cfg, out, watch = setup
    if needle is None:
        code, err = _run(capsys, ["render", cfg, "-q", f"prompt:={value}"])
        assert code == 0, err
        assert json.loads(Path(f"{out}.json").read_text())["prompt"] == "blurry low quality"
    else:
        _refused(capsys, watch, ["render", cfg, "-q", f"prompt:={value}"], needle)


def test_text_is_never_resolved(capsys, setup, tmp_path, monkeypatch):
    """`${...}` in text (a string key's KEY=VALUE, an escaped `\\${` in a preset) reaches the video's
    sidecar as that text, and is never resolved again: not by the load that un-escapes it, nor by a
    decode that re-reads the stored config."""
    cfg, out, watch = setup
    monkeypatch.setenv("VIDGEN_TEST_SECRET", "hunter2")
    data = yaml.safe_load(Path(cfg).read_text())
    data["negative_prompt"] = "no \\${oc.env:VIDGEN_TEST_SECRET}"    # YAML's escape: the text ${oc.env:...}
    _write(Path(cfg), data)
    code, err = _run(capsys, ["render", cfg, "-q", "prompt=a fox ${oc.env:VIDGEN_TEST_SECRET} #1: yes",
                              "output.save_latents=true"])
    assert code == 0, err
    sidecar = json.loads(Path(f"{out}.json").read_text())
    assert sidecar["prompt"] == "a fox ${oc.env:VIDGEN_TEST_SECRET} #1: yes"
    assert sidecar["negative_prompt"] == "no ${oc.env:VIDGEN_TEST_SECRET}"
    latents = out.with_name(out.stem + ".latents.safetensors")
    again = out.with_name("again.mp4")
    code, err = _run(capsys, ["decode", str(latents), "-q", f"output.path={again}"])
    assert code == 0, err
    text = Path(f"{again}.json").read_text()
    assert "hunter2" not in text and "hunter2" not in Path(f"{out}.json").read_text()
    assert json.loads(text)["prompt"] == "a fox ${oc.env:VIDGEN_TEST_SECRET} #1: yes"


def test_reference_loops_and_wrong_kinds(capsys, setup, tmp_path):
    cfg, out, watch = setup
    data = yaml.safe_load(Path(cfg).read_text())
    data["prompt"], data["negative_prompt"] = "${negative_prompt}", "${prompt}"
    _refused(capsys, watch, ["render", _write(tmp_path / "loop.yaml", data), "-q"], "reference")
    data = yaml.safe_load(Path(cfg).read_text())
    data["sampling"]["steps"] = "${prompt}"
    _refused(capsys, watch, ["render", _write(tmp_path / "kind.yaml", data), "-q"], "sampling.steps", "not an integer")
    data = yaml.safe_load(Path(cfg).read_text())
    data["sampling"]["steps"] = "${prompt.x}"
    _refused(capsys, watch, ["render", _write(tmp_path / "deep.yaml", data), "-q"], "reference")


@pytest.mark.parametrize("name", ["/etc/passwd", "../outside.yaml", "~/x.yaml", "sub/../../outside.yaml",
                                  "notes.txt"])
def test_defaults_only_beside_the_config_or_shipped(capsys, setup, tmp_path, name):
    cfg, out, watch = setup
    (tmp_path.parent / "outside.yaml").write_text("prompt: from outside\n")
    (tmp_path / "notes.txt").write_text("secret: hunter2\n")
    data = yaml.safe_load(Path(cfg).read_text())
    data["defaults"] = [name]
    line = _refused(capsys, watch, ["render", _write(tmp_path / "d.yaml", data), "-q"], "defaults:")
    assert "root:" not in line and "hunter2" not in line


def test_defaults_beside_and_shipped_presets_work(setup, tmp_path):
    from vidgen.presets import load_config

    cfg, _, _ = setup
    data = yaml.safe_load(Path(cfg).read_text())
    (tmp_path / "common").mkdir()
    _write(tmp_path / "common" / "steps.yaml", {"sampling": {"steps": 3}})
    del data["sampling"]["steps"]
    data["defaults"] = ["base.yaml", "common/steps.yaml"]            # base.yaml: a shipped preset
    assert load_config(_write(tmp_path / "d.yaml", data)).sampling.steps == 3


def test_errors_never_echo_a_files_contents(capsys, setup, tmp_path):
    _, _, watch = setup
    secret = tmp_path / "secrets.yaml"
    secret.write_text("api_key:hunter2-hunter2-hunter2-hunter2-hunter2-hunter2-hunter2 more words\n: : bad\n")
    line = _refused(capsys, watch, ["render", str(secret), "-q"], "not valid YAML", "line 2")
    assert "hunter2" not in line
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00binary")
    _refused(capsys, watch, ["render", str(tmp_path / "bin.yaml"), "-q"], "not a text file")


# ------------------------------------------------------------------------------- 9, 10, 16, 18. refused up front

def test_a_name_too_long_for_the_derived_files_is_refused_before_sampling(capsys, setup):
    cfg, out, watch = setup
    long = out.parent / ("x" * 230 + ".mp4")      # fits alone; `.NAME.latents.partial-*.safetensors` does not
    line = _refused(capsys, watch, ["render", cfg, "-q", f"output.path={long}"], "this filesystem allows 255",
                    "shorten it by 19 bytes")
    assert line.count("too long") == 1


@pytest.mark.parametrize("override, needle", [
    ("num_frames=129", "rotary"),            # the tiny model's rope_max_seq_len is 32 latent frames
    ("size=1024x64", "rotary"),
    ("num_frames=1000001", "num_frames: 1000001 is out of range"),
    ("output.crf=60", "crf 60 is out of range for h264; use 0..51"),
    ("loras=[{a: 1", "is not valid YAML"),
    ("prompt:=[unclosed", "is not valid YAML"),
    ("seed=3 #4", "YAML would drop '#4' as a comment"),
])
def test_refused_before_any_weights_load(capsys, setup, monkeypatch, override, needle):
    cfg, out, watch = setup
    monkeypatch.setattr(vidgen.pipeline, "load_components", lambda *a, **k: pytest.fail("weights were loaded"))
    _refused(capsys, watch, ["render", cfg, "-q", override], needle)


# ------------------------------------------------------------------------------- 11. conditioning images

@pytest.fixture
def ti2v(base_cfg, tiny_model, tmp_path):
    cfg = base_cfg("wan2.2-ti2v-5b")
    return _write(tmp_path / "ti2v.yaml", cfg), (tmp_path, tiny_model("wan2.2-ti2v-5b"))


def test_decompression_bomb(capsys, ti2v, tmp_path, monkeypatch):
    import PIL.Image

    cfg, watch = ti2v
    Image.new("RGB", (300, 300)).save(tmp_path / "bomb.png")
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 20_000)     # Pillow's own check: error above twice this
    _refused(capsys, watch, ["render", cfg, "-q", f"image={tmp_path / 'bomb.png'}"], "more pixels than Pillow",
             "downscale")
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", None)
    monkeypatch.setattr(vidgen.preflight, "MAX_IMAGE_PIXELS", 50_000)   # ours, checked from the header
    _refused(capsys, watch, ["render", cfg, "-q", f"image={tmp_path / 'bomb.png'}"], "is 300x300, more than the 50,000")


@pytest.mark.parametrize("size", [(4000, 16), (16, 4000)])
def test_extreme_aspect_ratio(capsys, ti2v, tmp_path, size):
    cfg, watch = ti2v
    Image.fromarray(np.zeros((size[1], size[0], 3), np.uint8)).save(tmp_path / "thin.png")
    _refused(capsys, watch, ["render", cfg, "-q", f"image={tmp_path / 'thin.png'}"], "too narrow", "image_fit=crop")


# ------------------------------------------------------------------------------- 20, 21. the last steps

def test_disk_full_at_the_sidecar_leaves_no_video(capsys, setup, monkeypatch):
    import vidgen.io

    cfg, out, _ = setup

    def no_space(path, data):
        if str(path).endswith(".json"):
            raise OSError(28, "No space left on device")
        return real(path, data)

    real = vidgen.io._write_synced
    monkeypatch.setattr(vidgen.io, "_write_synced", no_space)
    code, err = _run(capsys, ["render", cfg, "-q"])
    assert_refused(code, err, "No space left on device")
    assert not out.exists() and not Path(f"{out}.json").exists()
    assert sorted(os.listdir(out.parent)) == ["clip.latents.safetensors"]     # the sampling is kept


def test_escaped_braces_in_the_output_path(capsys, setup):
    cfg, out, _ = setup
    template = str(out.parent / "{{x}}-{seed}.mp4")
    code, err = _run(capsys, ["render", cfg, "-q", f"output.path={template}"])
    assert code == 0, err
    video = out.parent / "{x}-7.mp4"
    assert read_video_info(video)["frames"] == 9
    latents = out.parent / "{x}-7.latents.safetensors"
    code, err = _run(capsys, ["decode", str(latents), "-q", f"output.path={out.parent / '{{x}}-again.mp4'}"])
    assert code == 0, err
    assert read_video_info(out.parent / "{x}-again.mp4")["frames"] == 9


# ------------------------------------------------------------------------------- 25. the Python API

def test_overrides_as_one_string(setup):
    cfg, _, _ = setup
    with pytest.raises(ConfigError) as e:
        vidgen.render(cfg, overrides="sampling.steps=2")
    assert len(e.value.problems) == 1 and "is a string; give a list" in e.value.problems[0]
    with pytest.raises(ConfigError, match="is a string"):
        vidgen.render(cfg, overrides="sampling.steps=2", seed=1)


def test_text_no_file_can_hold_is_refused_before_any_weights_load(setup, monkeypatch):
    """A lone surrogate in a prompt (or NUL in a path) given to the Python API is refused when the config
    loads, naming the key, not after minutes of sampling when the sidecar is written."""
    cfg, out, watch = setup
    monkeypatch.setattr(vidgen.pipeline, "load_components", lambda *a, **k: pytest.fail("weights were loaded"))
    with untouched(*watch):
        with pytest.raises(ConfigError) as e:
            vidgen.render(cfg, prompt="a fox \udc80 in snow")
        assert e.value.problems == ["prompt: contains a lone surrogate ('\\udc80' at position 6), which is not text "
                                    "a file can hold; fix the text's encoding"]
        with pytest.raises(ConfigError, match=r"^invalid config in .*: output.path: contains a NUL character"):
            vidgen.render(cfg, output={"path": str(out.parent / "x\x00.mp4")})


def test_the_service_checks_the_files_overrides_name_as_the_config_reads_them():
    """The service's roots check (before planning opens anything) sees an override's file as load_config
    will: a string key's value whole, and `KEY:=VALUE` as YAML (`image:=...` was not checked at all)."""
    from vidgen.queue.service import _named_files

    named = _named_files({}, ["image:=/outside/a.png", "last_image=in,/../../etc/x.png", "model.path:='/m'",
                              "loras=[{path: /outside/l.safetensors}]", "guard.blocklists=[default, /b.txt]",
                              "seed=3", "prompt=image=/not/a/file"])
    assert sorted(named) == sorted(["/outside/a.png", "in,/../../etc/x.png", "/m", "/outside/l.safetensors",
                                    "/b.txt"])
