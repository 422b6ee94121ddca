"""Long takes that hold: windows that share several frames (continuity.overlap_frames: K) through each
variant's own conditioning, and a prompt per window (continuity.prompts), on tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vidgen
from test_continuity import IMAGE, _run, _wf
from vidgen.cli import main
from vidgen.errors import ConfigError
from vidgen.io import read_frames, read_video_info
from vidgen.paths import sidecar_path
from vidgen.queue.api import check_specs
from vidgen.queue.workflow import load_workflow, plan_jobs

# The first K frames of a window against the previous window's last K (as kept, PNG), mean |difference|
# of 0-255. VACE writes them as given: 0. TI2V-5B keeps their latents clean: they are the VAE's round trip
# of the kept frames (the causal decoder's first frames depend on those latents alone), checked against
# it below. I2V marks them known and the model regenerates them: measured 37 on the tiny random models.
SHARED_ERROR = {"wan2.1-vace": 0.0, "wan2.2-ti2v-5b": 45.0, "wan2.2-i2v-a14b": 45.0}


def _round_trip(model: Path, frames: list[np.ndarray]) -> list[np.ndarray]:
    """The frames through the model's VAE: encoded, decoded, as uint8."""
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(model, subfolder="vae").float()
    x = torch.from_numpy(np.stack(frames)).permute(3, 0, 1, 2)[None].float() / 127.5 - 1
    with torch.no_grad():
        y = vae.decode(vae.encode(x).latent_dist.mode()).sample
    return list(((y.clamp(-1, 1) + 1) * 127.5).round().byte()[0].permute(1, 2, 3, 0).numpy())


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(SHARED_ERROR))
def test_a_take_whose_windows_share_five_frames(variant, tiny_model, tmp_path, monkeypatch):
    """29 frames in 13-frame windows sharing 5: 3 windows (13, 13, 13), each starting on the last 5
    frames of the one before (kept as PNG), and the film (lossless PNG frames) shows them once."""
    monkeypatch.chdir(tmp_path)
    image = f", image: {IMAGE}, image_fit: crop" if variant == "wan2.2-i2v-a14b" else ""
    wf = load_workflow(_wf(tmp_path, tiny_model(variant), """\
        - {name: take, prompt: a red circle moving right, num_frames: 29,
           continuity: {window_frames: 13, overlap_frames: 5}}
        """, "steps:\n  stitch: {output: film}\n  contact_sheet: {output: sheet.png}\n", ", output.codec: png" + image))
    w1, w2, w3 = wf.shots
    assert [s.config.num_frames for s in wf.shots] == [13, 13, 13] and w2.deps == [0] and w3.deps == [1]
    assert sorted(w1.config.output.keep_frames) == [8, 9, 10, 11, 12]
    jobs = plan_jobs(wf)
    assert jobs[3].payload["joins"] == [0, 5, 5]
    check_specs(jobs)                   # the kept frames do not exist yet: stand-ins
    _run(jobs)
    windows = [list(read_frames(s.config.output.path)) for s in wf.shots]
    for prev, this, entry in ((windows[0], windows[1], w1), (windows[1], windows[2], w2)):
        kept = [np.asarray(Image.open(f"{entry.config.output.path}.frame-{k}.png")) for k in range(8, 13)]
        assert all(np.array_equal(k, p) for k, p in zip(kept, prev[8:]))        # the PNG output is lossless too
        err = np.mean([np.abs(a.astype(int) - b).mean() for a, b in zip(this[:5], kept)])
        assert err <= SHARED_ERROR[variant], err
        if variant == "wan2.2-ti2v-5b":
            trip = _round_trip(tiny_model(variant), kept)
            assert np.mean([np.abs(a.astype(int) - b).mean() for a, b in zip(this[:5], trip)]) < 0.01
    film = list(read_frames(wf.output_dir / "film"))
    assert len(film) == 29
    expected = windows[0] + windows[1][5:] + windows[2][5:]
    assert all(np.array_equal(a, b) for a, b in zip(film, expected))


def test_five_shared_frames_condition_the_i2v_mask_and_the_ti2v_clean_latents(tiny_model, tmp_path):
    """image_frames: I2V marks each given video frame in its mask; TI2V-5B keeps 1 + 4/4 = 2 latent frames
    clean. With no image_frames the conditions are those of one image (unchanged)."""
    from vidgen.conditioning import image_condition
    from vidgen.pipeline import Pipeline

    frames = []
    for i in range(5):
        Image.fromarray(np.full((64, 64, 3), 40 * i, dtype=np.uint8)).save(tmp_path / f"f{i}.png")
        frames.append(str(tmp_path / f"f{i}.png"))
    for variant in ("wan2.2-i2v-a14b", "wan2.2-ti2v-5b"):
        pipe = Pipeline.from_config({"model": {"path": str(tiny_model(variant)), "device": "cpu"}, "prompt": "x",
                                     "size": "64x64", "num_frames": 13, "image": frames[0], "image_frames": frames[1:],
                                     "output": {"path": str(tmp_path / "o.mp4")}})
        plan = vidgen.preflight.check(pipe.config, pipe.target.info)
        z, (t, h, w) = pipe.target.info.latent_shape(64, 64, 13)[1], pipe.target.info.latent_shape(64, 64, 13)[2:]
        latents = torch.zeros(1, z, t, h, w)
        concat, first = image_condition(pipe.components.vae, plan, latents)
        if variant == "wan2.2-i2v-a14b":
            mask = concat[0, :4, :, 0, 0]               # [4 video frames a latent frame, T]
            assert mask[:, 0].tolist() == [1, 1, 1, 1] and mask[:, 1].tolist() == [1, 1, 1, 1]
            assert mask[:, 2:].sum() == 0
        else:
            cond, clean = first
            assert clean[0, 0, :, 0, 0].tolist() == [0, 0, 1, 1]
            assert cond.shape[2] == t and cond[:, :, 2:].abs().sum() == 0


def test_a_prompt_per_window(tiny_model, tmp_path, monkeypatch):
    """A window takes the prompt in force at its first frame; the sidecar of each window records it."""
    monkeypatch.chdir(tmp_path)
    wf = load_workflow(_wf(tmp_path, tiny_model("wan2.2-ti2v-5b"), """\
        - {name: take, prompt: a red circle, num_frames: 25,
           continuity: {window_frames: 9, prompts: [{at: 8, prompt: a blue circle}, {at: 12, prompt: a green square}]}}
        """))
    assert [s.config.prompt for s in wf.shots] == ["a red circle", "a blue circle", "a green square"]
    assert any("at 12 takes effect at frame 16" in n for n in wf.notes)
    _run(plan_jobs(wf))
    said = [json.loads(sidecar_path(Path(s.config.output.path)).read_text())["prompt"] for s in wf.shots]
    assert said == ["a red circle", "a blue circle", "a green square"]


def test_overlap_and_prompt_problems_are_reported_together(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _wf(tmp_path, tiny_model("wan2.2-ti2v-5b"), """\
        - {name: a, prompt: x, num_frames: 25, continuity: {window_frames: 9, overlap_frames: 3}}
        - {name: b, prompt: x, num_frames: 25, continuity: {window_frames: 9, overlap_frames: 9}}
        - {name: c, prompt: x, num_frames: 25, continuity: {window_frames: 9, prompts: [{at: 30, prompt: y}]}}
        - {name: d, prompt: x, num_frames: 25, continuity: {window_frames: 9, prompts: [{at: 20, prompt: y}]}}
        - {name: e, prompt: x, num_frames: 25, continuity: {prompts: [{at: 0}]}}
        """)
    with pytest.raises(ConfigError) as e:
        load_workflow(path)
    text = "\n".join(e.value.problems)
    for needle in ("shots[0].continuity.overlap_frames: 3; windows share 4k+1 frames",
                   "shot 'b': continuity.overlap_frames: 9 is not less than the 9-frame window",
                   "shot 'c': continuity.prompts: at 30 is beyond the take's 25 frames",
                   "shot 'd': continuity.prompts: at 20 falls in the last window, which starts at frame 16",
                   "shots[4].continuity.prompts: [{'at': 0}]; give a list of {at: FRAME, prompt: TEXT}"):
        assert needle in text, text


def test_ti2v_takes_whole_latent_frames(base_cfg, tmp_path, capsys):
    frames = []
    for i in range(3):
        Image.new("RGB", (64, 64)).save(tmp_path / f"f{i}.png")
        frames.append(str(tmp_path / f"f{i}.png"))
    cfg = base_cfg("wan2.2-ti2v-5b", image=frames[0], image_frames=frames[1:], image_fit="crop")
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["render", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "image_frames: wan2.2-ti2v-5b keeps whole latent frames" in err[0], err
    assert not (tmp_path / "out").exists()


def _key(path: Path, value: int) -> str:
    Image.fromarray(np.full((64, 64, 3), value, dtype=np.uint8)).save(path)
    return str(path)


@pytest.mark.slow
def test_key_frames_split_the_take_and_land_as_window_ends(tiny_model, tmp_path, monkeypatch):
    """Key frames at 8 and 20 of a 25-frame take (13-frame windows): windows end on them (0-8, 8-20, 20-24),
    each of those windows has its key frame as last_image, and its conditioning carries that image."""
    from vidgen.conditioning import image_condition
    from vidgen.pipeline import Pipeline
    from vidgen.presets import load_config

    monkeypatch.chdir(tmp_path)
    a, b = _key(tmp_path / "a.png", 200), _key(tmp_path / "b.png", 30)
    wf = load_workflow(_wf(tmp_path, tiny_model("wan2.2-i2v-a14b"), f"""\
        - {{name: take, prompt: x, num_frames: 25, image: {IMAGE}, overrides: {{image_fit: crop}},
           continuity: {{window_frames: 13, keyframes: [{{at: 20, image: b.png}}, {{at: 8, image: a.png}}]}}}}
        """, "steps:\n  stitch: {output: film.mp4}\n"))
    assert [s.config.num_frames for s in wf.shots] == [9, 13, 5]
    assert [s.config.last_image for s in wf.shots] == [a, b, None]
    assert any("3 windows of 9, 13, 5 frames" in n for n in wf.notes)
    jobs = plan_jobs(wf)
    check_specs(jobs)
    _run(jobs)
    cfg = load_config(jobs[1].payload)
    cfg.output.path = str(wf.output_dir / "probe.mp4")      # window 2 again, its conditions only
    pipe = Pipeline.from_config(cfg)
    plan = vidgen.preflight.check(cfg, pipe.target.info)
    z, t, h, w = pipe.target.info.latent_shape(64, 64, 13)[1:]
    concat, _ = image_condition(pipe.components.vae, plan, torch.zeros(1, z, t, h, w))
    assert concat[0, :4, -1, 0, 0].tolist() == [0, 0, 0, 1]     # the window's last video frame is given
    from vidgen.vae import encode, normalize
    frames = torch.zeros(1, 3, 13, 64, 64)
    frames[:, :, 0] = torch.from_numpy(np.array(plan.image.convert("RGB"))).permute(2, 0, 1).float() / 127.5 - 1
    frames[:, :, -1] = 30 / 127.5 - 1
    want = normalize(pipe.components.vae, encode(pipe.components.vae, frames).float())
    assert torch.allclose(concat[0, 4:, -1], want[0, :, -1], atol=1e-4)
    assert read_video_info(wf.output_dir / "film.mp4")["frames"] == 25


def test_key_frame_problems_are_reported_together(tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _key(tmp_path / "a.png", 200)
    path = _wf(tmp_path, tiny_model("wan2.2-i2v-a14b"), f"""\
        - {{name: a, prompt: x, num_frames: 25, image: {IMAGE}, overrides: {{image_fit: crop}},
           continuity: {{keyframes: [{{at: 40, image: a.png}}, {{at: 4, image: a.png}}]}}}}
        - {{name: d, prompt: x, num_frames: 25, image: {IMAGE}, overrides: {{image_fit: crop}},
           continuity: {{keyframes: [{{at: 10, image: a.png}}]}}}}
        - {{name: b, prompt: x, num_frames: 25, image: {IMAGE}, overrides: {{image_fit: crop}},
           continuity: {{keyframes: [{{at: 8, image: a.png}}, {{at: 8, image: nowhere.png}}]}}}}
        - {{name: c, prompt: x, num_frames: 25, continuity: {{keyframes: [{{at: 8, image: a.png}}]}},
           overrides: {{model.path: {tiny_model("wan2.2-ti2v-5b")}}}}}
        """)
    with pytest.raises(ConfigError) as e:
        load_workflow(path)
    text = "\n".join(e.value.problems)
    for needle in ("shot 'a': continuity.keyframes: at 40 is beyond the take's 25 frames",
                   "shots[1].continuity.keyframes: at 10; a window ends on frames 4k (its 4k+1 frames after the one "
                   "before), so a key frame lands at a multiple of 4: use 8 or 12",
                   "shots[2].continuity.keyframes: two key frames at frame 8",
                   "shots[2].continuity.keyframes: at 8: image 'nowhere.png' does not exist",
                   "shot 'c': continuity.keyframes: a key frame lands as a window's last frame (last_image, or "
                   "VACE's kept last frame), which wan2.2-ti2v-5b cannot take"):
        assert needle in text, text
    assert main(["queue", "--db", str(tmp_path / "q.db"), "submit", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "continuity.keyframes" in err[0] and not (tmp_path / "q.db").exists()


def test_a_key_frame_on_vace_is_kept_as_given(tiny_model, tmp_path, monkeypatch):
    """On a VACE model a key frame is the window's kept last frame (control.last_frame): the film (lossless
    PNG frames) shows the key image exactly at its frame, and the next window starts from it."""
    monkeypatch.chdir(tmp_path)
    key = np.zeros((64, 64, 3), dtype=np.uint8)
    key[16:48, 8:40] = (30, 200, 90)
    Image.fromarray(key).save(tmp_path / "key.png")
    wf = load_workflow(_wf(tmp_path, tiny_model("wan2.1-vace"), """\
        - {name: take, prompt: a red circle moving right, num_frames: 17,
           continuity: {window_frames: 13, keyframes: [{at: 8, image: key.png}]}}
        """, "steps:\n  stitch: {output: film}\n", ", output.codec: png"))
    assert [s.config.num_frames for s in wf.shots] == [9, 9]
    assert wf.shots[0].config.control.last_frame == str(tmp_path / "key.png") and wf.shots[0].config.last_image is None
    jobs = plan_jobs(wf)
    check_specs(jobs)
    _run(jobs)
    film = list(read_frames(wf.output_dir / "film"))
    assert len(film) == 17 and np.array_equal(film[8], key)
    assert not np.array_equal(film[7], key) and not np.array_equal(film[9], key)


def test_fuse_linear_blends_the_shared_frames(tiny_model, tmp_path, monkeypatch):
    """continuity.fuse: linear: the film blends each window's 5 shared frames with the previous window's
    last 5 (weights 1/6 ... 5/6) instead of dropping them; the take keeps its 29 frames."""
    monkeypatch.chdir(tmp_path)
    wf = load_workflow(_wf(tmp_path, tiny_model("wan2.2-ti2v-5b"), """\
        - {name: take, prompt: a red circle moving right, num_frames: 29,
           continuity: {window_frames: 13, overlap_frames: 5, fuse: linear}}
        """, "steps:\n  stitch: {output: film}\n", ", output.codec: png"))
    jobs = plan_jobs(wf)
    assert jobs[-1].payload["joins"] is None and jobs[-1].payload["blends"] == [0, 5, 5]
    _run(jobs)
    w1, w2, _ = (list(read_frames(s.config.output.path)) for s in wf.shots)
    film = list(read_frames(wf.output_dir / "film"))
    assert len(film) == 29 and all(np.array_equal(film[i], w1[i]) for i in range(8))
    for j in range(5):
        a = (j + 1) / 6
        assert np.array_equal(film[8 + j], np.rint((1 - a) * w1[8 + j] + a * w2[j]).astype(np.uint8))
    assert np.array_equal(film[13], w2[5])
    with pytest.raises(ConfigError, match="fuse: linear blends the frames windows share"):
        load_workflow(_wf(tmp_path, tiny_model("wan2.2-ti2v-5b"), """\
            - {name: take, prompt: x, num_frames: 29, continuity: {window_frames: 13, fuse: linear}}
            """))
