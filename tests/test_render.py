"""End to end: config -> tiny model -> playable video, through the real loader and writer."""

from __future__ import annotations

import json

import pytest
import torch

import vidgen
from vidgen.io import read_video_info
from vidgen.resume import read_latents


def test_render_writes_playable_video(base_cfg, tmp_path):
    events = []
    result = vidgen.render(base_cfg(num_frames=17, fps=12, size="96x64"), callback=events.append)
    info = read_video_info(result.path)
    assert (info["frames"], info["width"], info["height"]) == (17, 96, 64)
    assert info["fps"] == pytest.approx(12)
    assert json.loads(info["metadata"]["comment"])["seed"] == 7
    assert result.num_frames == 17 and result.seed == 7 and result.path.name == "clip.mp4"
    sidecar = json.loads(result.path.with_name("clip.mp4.json").read_text())
    assert sidecar["prompt"].startswith("a red circle") and sidecar["config_digest"] == result.config_digest
    assert set(result.timings) == {"encode", "denoise", "decode_write"} and result.peak_memory_bytes > 0
    stages = [e.stage for e in events]
    assert stages.index("encode") < stages.index("denoise") < stages.index("decode")
    assert events[-1].stage == "decode" and events[-1].step == events[-1].total == 17
    assert not list(result.path.parent.glob(".*partial*"))


@pytest.mark.parametrize("ext,codec", [(".webm", "vp9"), (".gif", "gif"), ("", "png"), (".mp4", "h265")])
def test_other_outputs(base_cfg, tmp_path, ext, codec):
    out = tmp_path / f"clip{ext}"
    result = vidgen.render(base_cfg(output={"path": str(out), "codec": "auto" if codec != "h265" else codec}))
    info = read_video_info(out)
    assert info["frames"] == 9 and (info["width"], info["height"]) == (64, 64)
    assert result.path == out


def test_pipeline_stays_loaded_and_seeds_reproduce(base_cfg, tmp_path):
    pipe = vidgen.Pipeline.from_config(base_cfg())
    model = pipe.components.experts[0]
    a = pipe.generate(seed=1, output={"path": str(tmp_path / "a.mp4")})
    b = pipe.generate(seed=1, output={"path": str(tmp_path / "b.mp4")}, prompt="a blue square moving up")
    c = pipe.generate(**{"seed": 1, "output.path": str(tmp_path / "c.mp4")})
    assert pipe.components.experts[0] is model
    la, lb, lc = (read_latents(r.latents_path)[0] for r in (a, b, c))
    assert torch.equal(la, lc) and not torch.equal(la, lb)
    with pytest.raises(vidgen.ConfigError, match="differ from the loaded pipeline"):
        pipe.generate(model={"dtype": "bfloat16"})


def test_random_seed_is_reported(base_cfg):
    result = vidgen.render(base_cfg(seed=None, output={"path": base_cfg()["output"]["path"].replace("clip", "{seed}")}))
    assert result.path.name == f"{result.seed}.mp4"
    assert json.loads(result.path.with_name(result.path.name + ".json").read_text())["seed"] == result.seed


def test_decode_finishes_a_render_from_latents(base_cfg, tmp_path):
    from vidgen.io import read_frames

    # PNG frames: lossless, so the comparison checks vidgen's pixels, not the video encoder's.
    first = vidgen.render(base_cfg(output={"path": str(tmp_path / "first")}))
    again = vidgen.decode_latents(first.latents_path, **{"output.path": str(tmp_path / "again")})
    a, b = list(read_frames(first.path)), list(read_frames(again.path))
    assert len(a) == len(b) == 9 and all((x == y).all() for x, y in zip(a, b))
    assert first.latents_path.exists()      # the user's latents are never removed by decode
    mp4 = vidgen.decode_latents(first.latents_path, **{"output.path": str(tmp_path / "again.mp4")})
    assert read_video_info(mp4.path)["frames"] == 9


def test_failed_decode_keeps_latents_and_leaves_no_video(base_cfg, monkeypatch):
    import vidgen.deliver
    import vidgen.pipeline as pl

    def boom(*a, **k):
        raise RuntimeError("decoder exploded")
        yield

    monkeypatch.setattr(vidgen.deliver, "decode_frames", boom)
    cfg = base_cfg()
    with pytest.raises(RuntimeError):
        vidgen.render(cfg)
    out = pl.Path(cfg["output"]["path"])
    assert not out.exists() and out.with_name("clip.latents.safetensors").exists()
    assert not list(out.parent.glob(".*partial*"))


def test_save_latents_false_removes_them(base_cfg):
    result = vidgen.render(base_cfg(output={"save_latents": False}))
    assert result.latents_path is None and not list(result.path.parent.glob("*.safetensors"))


def test_half_precision_model_on_cpu(base_cfg):
    """bf16 transformer and text encoder (diffusers keeps some modules in fp32): the denoiser feeds the
    model its compute dtype, as on a GPU."""
    result = vidgen.render(base_cfg(model={"dtype": "bfloat16"}))
    assert read_video_info(result.path)["frames"] == 9


def test_prompt_slug_cuts_between_words():
    from vidgen.io import slug as _slug

    assert _slug("a red circle moving right on a black background") == "a-red-circle-moving-right-on-a-black-background"
    assert _slug("a yellow triangle moving down on a gray background") == "a-yellow-triangle-moving-down-on-a-gray"
    assert _slug("x" * 60) == "x" * 48 and _slug("  ...  ") == "render"


def test_safetensors_outputs_follow_the_umask(tmp_path):
    # latents and checkpoints sit next to the video in shared output folders: same permissions
    import os

    from vidgen.resume import write_safetensors

    old = os.umask(0o022)
    try:
        path = tmp_path / "x.latents.safetensors"
        write_safetensors(path, {"a": torch.arange(3.0)}, {"format": "test"}, "cannot write")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == [path.name]       # no temporary file left


# ------------------------------------------------------------------------------- names that never collide


def test_a_template_output_takes_the_next_free_name(base_cfg, tmp_path, caplog):
    """A re-run of a command whose output.path is a template (the shipped presets' and the README's)
    takes the next number, counting every file of that name, and says which; same seed, same latents."""
    template = str(tmp_path / "out" / "clip-{seed}.mp4")
    pipe = vidgen.Pipeline.from_config(base_cfg(output={"path": template}))
    first = pipe.generate()
    with caplog.at_level("INFO", logger="vidgen"):
        second = pipe.generate()
    assert (first.path.name, second.path.name) == ("clip-7.mp4", "clip-7-2.mp4")
    assert f"clip-7.mp4 is taken; this render writes {second.path}" in caplog.text
    assert second.latents_path.name == "clip-7-2.latents.safetensors"
    assert torch.equal(read_latents(first.latents_path)[0], read_latents(second.latents_path)[0])
    (tmp_path / "out" / "clip-7-3.resume.safetensors").write_bytes(b"someone's checkpoint")  # a video name is not
    (tmp_path / "out" / "clip-7-4.mp4.json").write_bytes(b"someone's sidecar")               # free while its files
    assert pipe.generate().path.name == "clip-7-5.mp4"                                        # are there
    assert (tmp_path / "out" / "clip-7-3.resume.safetensors").read_bytes() == b"someone's checkpoint"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        ["clip-7-3.resume.safetensors", "clip-7-4.mp4.json"] + [f"clip-7{n}{ext}" for n in ("", "-2", "-5")
                                                               for ext in (".mp4", ".mp4.json", ".latents.safetensors")])


def test_a_path_the_user_gave_is_refused_in_one_short_line(base_cfg, tmp_path, capsys):
    from hostile import assert_refused, untouched

    from vidgen.cli import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(json.dumps(base_cfg()))
    assert main(["render", str(cfg), "-q"]) == 0
    capsys.readouterr()
    with untouched(tmp_path):
        code = main(["render", str(cfg), "-q"])
    line = assert_refused(code, capsys.readouterr().err, "clip.mp4' already exists", "(with 2 files beside it)",
                          "give another output.path, or set output.overwrite=true")
    assert len(line.replace(str(tmp_path), "")) < 160 and line.count("already exists") == 1, line


@pytest.mark.parametrize("template", [False, True])
def test_a_second_render_to_one_path_moves_all_its_files(base_cfg, tmp_path, template):
    """Two renders passed the exists check for one path: whichever name one finds taken first — the
    checkpoint, the latents or the video — all of its files move to the next name together, and the
    other render's files are left as they are."""
    from vidgen.errors import OutputError

    out = tmp_path / "out"
    path = str(out / ("clip-{seed}.mp4" if template else "clip.mp4"))
    name = "clip-7" if template else "clip"
    theirs = {f"{name}.resume.safetensors": b"the other render's checkpoint"}

    def other_render(p):     # its checkpoint lands first, then (while this one samples on) its latents, then its clip
        if p.stage == "denoise" and p.step == 0:
            (out / f"{name}.resume.safetensors").write_bytes(theirs[f"{name}.resume.safetensors"])
        if p.stage == "denoise" and p.step == 3:
            theirs[f"{name}.latents.safetensors"] = b"the other render's latents"
            (out / f"{name}.latents.safetensors").write_bytes(theirs[f"{name}.latents.safetensors"])
        if p.stage == "decode" and p.step == 1:
            theirs[f"{name}.mp4"] = b"the other render's clip"
            (out / f"{name}.mp4").write_bytes(theirs[f"{name}.mp4"])

    cfg = base_cfg(output={"path": path}, sampling={"checkpoint_every": 1})
    if template:
        result = vidgen.render(cfg, callback=other_render)
        assert result.path == out / f"{name}-2.mp4" and result.latents_path == out / f"{name}-2.latents.safetensors"
    else:
        with pytest.raises(OutputError, match=rf"{name}.mp4 appeared while this ran.*kept as .*{name}-2\.mp4$"):
            vidgen.render(cfg, callback=other_render)
    assert {p: (out / p).read_bytes() for p in theirs} == theirs
    mine = sorted(p.name for p in out.iterdir() if p.name not in theirs)
    assert mine == [f"{name}-2.latents.safetensors", f"{name}-2.mp4", f"{name}-2.mp4.json"]
    assert read_video_info(out / f"{name}-2.mp4")["frames"] == 9
    assert read_latents(out / f"{name}-2.latents.safetensors")[0].shape[1] > 0


def test_the_derived_names_of_an_output():
    from pathlib import Path

    from vidgen.paths import derived_paths

    names = {role: p.name for role, p in derived_paths(Path("/r/x.mp4"), keep_frames=[16]).items()}
    assert names == {"video": "x.mp4", "sidecar": "x.mp4.json", "latents": "x.latents.safetensors",
                     "resume": "x.resume.safetensors", "preview": "x.mp4.preview.png", "frame-16": "x.mp4.frame-16.png"}
    assert derived_paths(Path("/r/x"))["latents"] == derived_paths(Path("/r/x.mkv"))["latents"]   # shared


@pytest.mark.parametrize("bad", ["a\x00b.mp4", "a\ud800b.mp4"])
def test_an_output_path_no_file_can_have_is_a_config_error(base_cfg, tmp_path, bad):
    from vidgen.errors import OutputError
    from vidgen.paths import check_targets, confine

    with pytest.raises(vidgen.ConfigError, match=r"^invalid config: output\.path: [^\n]*(NUL|surrogate)[^\n]*$"):
        vidgen.render(base_cfg(output={"path": str(tmp_path / bad)}))
    assert not (tmp_path / "out").exists()
    assert "output.path" in check_targets([("output.path", tmp_path / bad)], overwrite=False)[0]
    with pytest.raises(OutputError, match="NUL|cannot encode"):
        confine(tmp_path / bad, None)


# ------------------------------------------------------------------------------- decode: the user names the output


def _resaved(src, dst, **output):
    """A copy of the latents file `src` at `dst` whose stored config says `output` (as a hostile sender's would)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    config = json.loads(meta["config"])
    config["output"].update(output)
    dst.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst), metadata={**meta, "config": json.dumps(config)})
    return dst


def test_decode_writes_where_the_user_says_not_where_the_file_says(base_cfg, tmp_path, capsys):
    """A latents file someone sent names a video of yours and says overwrite: decode writes beside the
    file it was given, named after it, and replaces nothing unless told so on this command."""
    from hostile import assert_refused, untouched

    from vidgen.cli import main

    first = vidgen.render(base_cfg())
    victim = tmp_path / "mine"
    victim.mkdir()
    (victim / "film.mp4").write_bytes(b"my film")
    (victim / "film.mp4.json").write_bytes(b"its sidecar")
    sent = _resaved(first.latents_path, tmp_path / "inbox" / "gift.latents.safetensors",
                    path=str(victim / "film.mp4"), overwrite=True, root=str(victim))
    with untouched(victim):
        assert main(["decode", str(sent), "-q"]) == 0
        assert read_video_info(tmp_path / "inbox" / "gift.mp4")["frames"] == 9
        capsys.readouterr()
        line = assert_refused(main(["decode", str(sent), "-q"]), capsys.readouterr().err, "gift.mp4' already exists",
                              "give another output.path, or set output.overwrite=true")
        assert str(victim) not in line
        assert main(["decode", str(sent), "-q", "output.overwrite=true"]) == 0       # the user's own say-so
        assert main(["decode", str(sent), "-q", f"output.path={tmp_path / 'other.webm'}"]) == 0
    assert read_video_info(tmp_path / "other.webm")["frames"] == 9
    assert sorted(p.name for p in (tmp_path / "inbox").iterdir()) == ["gift.latents.safetensors", "gift.mp4",
                                                                       "gift.mp4.json"]


def test_decode_keeps_the_renders_container(base_cfg, tmp_path):
    first = vidgen.render(base_cfg(output={"path": str(tmp_path / "a" / "clip.gif")}))
    moved = tmp_path / "b" / "clip.latents.safetensors"
    moved.parent.mkdir()
    moved.write_bytes(first.latents_path.read_bytes())
    assert vidgen.decode_latents(moved).path == tmp_path / "b" / "clip.gif"


# ------------------------------------------------------------------------------- the README's VAE snippet


def test_the_vae_snippet_gives_vidgen_decodes_pixels(base_cfg, tmp_path):
    """README's snippet on a latents file vidgen saved: the same pixels as `vidgen decode` (PNG frames:
    lossless, so this compares the decoders, not a video codec); a bare tensor is refused."""
    import numpy as np
    from diffusers import AutoencoderKLWan
    from safetensors.torch import load_file

    from vidgen.io import read_frames
    from vidgen.vae import Latents, decode, decode_frames, load_latents, to_uint8

    cfg = base_cfg(output={"path": str(tmp_path / "frames")})
    first = vidgen.render(cfg)
    ours = np.stack(list(read_frames(vidgen.decode_latents(first.latents_path,
                                                           **{"output.path": str(tmp_path / "again")}).path)))
    # -- the snippet
    vae = AutoencoderKLWan.from_pretrained(cfg["model"]["path"], subfolder="vae")
    latents = load_latents(first.latents_path)              # what vidgen saved, in the space its file says
    video = decode(vae, latents, memory_budget="1.5GiB")    # [B, 3, F, H, W] in [-1, 1]
    frames = [frame for frame in decode_frames(vae, first.latents_path, memory_budget="auto")]
    # --
    assert latents.space == "model" and video.shape[2] == 9
    assert np.array_equal(np.stack([f.numpy() for f in frames]), ours)
    assert np.array_equal(to_uint8(video[0].movedim(1, 0)).numpy(), ours)
    raw = load_file(str(first.latents_path))["latents"]
    with pytest.raises(vidgen.ConfigError, match="does not say whether it is normalised: pass space='model'"):
        decode(vae, raw)
    assert np.array_equal(to_uint8(decode(vae, raw, space="model")[0].movedim(1, 0)).numpy(), ours)
    from vidgen.vae import denormalize

    assert torch.equal(decode(vae, denormalize(vae, raw), space="vae"), decode(vae, raw, space="model"))
    with pytest.raises(vidgen.ConfigError, match="model-space"):
        decode(vae, Latents(raw, "model"), space="vae")


def test_a_decode_whose_video_name_is_taken_meanwhile_leaves_the_latents_where_they_are(base_cfg, tmp_path):
    from vidgen.errors import OutputError

    first = vidgen.render(base_cfg(output={"path": str(tmp_path / "a" / "clip.mp4"), "save_latents": True}))
    sent = tmp_path / "b" / "clip.latents.safetensors"
    sent.parent.mkdir()
    sent.write_bytes(first.latents_path.read_bytes())

    def appears(p):
        if p.stage == "decode" and p.step == 1:
            (tmp_path / "b" / "clip.mp4").write_bytes(b"someone's clip")

    with pytest.raises(OutputError, match=r"clip\.mp4 appeared while this ran.*kept as .*clip-2\.mp4"):
        vidgen.decode_latents(sent, callback=appears)
    assert sorted(p.name for p in sent.parent.iterdir()) == ["clip-2.mp4", "clip-2.mp4.json", "clip.latents.safetensors",
                                                             "clip.mp4"]
