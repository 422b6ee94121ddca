"""Workflows: the shipped examples validate, every mistake is reported at once, outputs stay inside
output_dir, seconds become 4k+1 frames, jobs are planned with their deps, and the stitch and
contact-sheet executors produce the right frames on small synthetic clips."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vidgen.presets import load_config
from vidgen.errors import ConfigError, InputError, OutputError
from vidgen.io import VideoWriter, read_frames, read_video_info
from vidgen.queue.steps import LABEL_HEIGHT, run_contact_sheet, run_stitch
from vidgen.queue.workflow import is_workflow, load_workflow, plan_jobs, plan_single

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted(p.name for p in (ROOT / "workflows").glob("*.yaml"))
DEMO = ROOT / "configs" / "demo.yaml"
RED, GREEN, BLUE, WHITE, YELLOW = (230, 30, 30), (30, 200, 40), (40, 70, 230), (245, 245, 245), (240, 220, 30)


def write_workflow(folder: Path, body: str) -> Path:
    path = folder / "wf.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def problems_of(path: Path, overrides=None) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_workflow(path, overrides)
    return e.value.problems


def shots_yaml(*names: str, extra: str = "") -> str:
    lines = [f"  - {{name: {n}, prompt: a red circle moving right on a black background, seed: {i}}}"
             for i, n in enumerate(names)]
    return "\n".join(lines) + "\n" + extra


@pytest.fixture
def simple(tmp_path, monkeypatch):
    """write(shots_and_steps) -> a workflow file using the demo preset, outputs under tmp_path/out."""
    monkeypatch.chdir(tmp_path)

    def write(rest: str, output_dir: str = "out") -> Path:
        head = f"name: test\noutput_dir: {output_dir}\ndefaults:\n  config: {DEMO}\nshots:\n"
        return write_workflow(tmp_path, head + rest)
    return write


# ------------------------------------------------------------------------------- loading


def test_examples_exist():
    assert {"demo-shapes.yaml", "demo-story.yaml"} <= set(WORKFLOWS)


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """The repository's configs/, samples/ and workflows/ seen from an empty folder: the examples name
    them relative to the repository, and their outputs/ is then the test's own, not a user's earlier renders."""
    for name in ("configs", "samples", "workflows"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", WORKFLOWS)
def test_example_validates(name, checkout):
    path = ROOT / "workflows" / name
    assert is_workflow(path)
    wf = load_workflow(path)
    assert wf.shots and wf.stitch and wf.contact_sheet
    for shot in wf.shots:
        assert Path(shot.config.model.path).resolve() in (ROOT / "samples" / "demo-wan", ROOT / "samples" / "demo-wan-i2v",
                                                          ROOT / "samples" / "demo-wan-control")
        assert Path(shot.config.output.path).parent == wf.output_dir / "shots"
        assert shot.config.width * shot.config.height <= 64 * 64 and shot.config.num_frames <= 17
    jobs = plan_jobs(wf)
    assert [j.kind for j in jobs] == ["render"] * len(wf.shots) + ["stitch", "contact_sheet"]
    assert all(not j.problems(i) for i, j in enumerate(jobs))  # the ledger would accept them


def test_demo_shapes_and_story_contents(checkout):
    shapes = load_workflow(ROOT / "workflows" / "demo-shapes.yaml")
    assert len(shapes.shots) == 4 and 0 < shapes.stitch.crossfade <= 0.5
    story = load_workflow(ROOT / "workflows" / "demo-story.yaml")
    steps = {s.name: s.config.sampling.steps for s in story.shots}
    assert len(set(steps.values())) > 1  # a per-shot override took effect
    assert any("rendering" in note for note in story.notes)  # seconds were rounded, and it says so


def test_is_workflow_tells_configs_apart():
    assert not is_workflow(DEMO)
    assert not is_workflow(ROOT / "no-such-file.yaml")


def test_every_problem_is_reported_at_once(simple):
    path = simple(textwrap.dedent("""\
      - {name: a, prompt: a red circle moving right on a black background}
      - {name: short, prompt: a blue square moving up on a gray background, seconds: 1}
      - {name: bad, prompt: a green circle moving down on a gray background, num_frames: 16}
      - {name: missing, prompt: a white square moving left on a black background, image: nope.png}
      - {name: A, prompt: a yellow triangle moving left on a black background}
    steps:
      stitch: {output: all.mp4, crossfade: 1.5}
    colour: red
    """))
    problems = problems_of(path)
    assert len(problems) == 5, problems
    expected = ["colour: unknown key", "shots[2] (bad): num_frames: 16 is not 4k+1",
                "shots[3] (missing): image: 'nope.png' does not exist",
                "shots[4].name: 'A' is also the name of shots[0]",
                "steps.stitch.crossfade: 1.5 s (12 frames at 8 fps) is longer than shot 'short'"]
    for text in expected:
        assert any(p.startswith(text) for p in problems), (text, problems)


def test_continuity_and_file_problems_come_in_one_report(simple):
    """One pass: a missing file, a reference to a shot that does not exist, a reference to a shot with
    problems of its own (left until that shot is fixed), a `${...}` reference that cannot be filled
    in, and a bad continuity frame are all reported together."""
    path = simple(textwrap.dedent("""\
      - {name: a, prompt: a red circle moving right on a black background}
      - {name: missing, prompt: a white square moving left, image: nope.png}
      - {name: ghost, prompt: a blue square moving up, image: {from: nosuch}}
      - {name: onbroken, prompt: a blue square moving up, image: {from: missing}}
      - {name: unfilled, prompt: "${nope}"}
      - {name: late, prompt: a blue square moving up, image: {from: a, frame: 999}}
    """))
    problems = problems_of(path)
    expected = ["shots[1] (missing): image: 'nope.png' does not exist",
                "shot 'ghost': image.from: 'nosuch' is not a shot of this workflow",
                "shots[4].prompt: cannot fill in its ${...} reference",
                "shot 'late': image.frame: 999 is beyond shot 'a'"]
    for text in expected:
        assert any(p.startswith(text) for p in problems), (text, problems)
    assert len(problems) == 4, problems


@pytest.mark.parametrize("where", ["seconds", "crossfade", "string seconds", "huge"])
def test_non_finite_numbers_are_refused_in_one_line(simple, where):
    value = {"seconds": ".inf", "crossfade": ".nan", "string seconds": "'-inf'", "huge": "1e999"}[where]
    seconds = value if where != "crossfade" else "1"
    path = simple(f"  - {{name: s, prompt: a red circle, seconds: {seconds}}}\n"
                  f"steps:\n  stitch: {{output: all.mp4, crossfade: {value if where == 'crossfade' else 0}}}\n")
    key = "steps.stitch.crossfade" if where == "crossfade" else "shots[0].seconds"
    problems = problems_of(path)
    assert len(problems) == 1 and problems[0].startswith(f"{key}: ") and "not a finite number" in problems[0], problems


def test_every_float_field_refuses_nan_and_infinity():
    """The class: every float-typed field of every config schema (render config and workflow) refuses NaN
    and infinities at validation, naming the key (a float type-checks them, a range check need not)."""
    import dataclasses
    from typing import get_type_hints

    from vidgen.config import LoraConfig, RenderConfig
    from vidgen.presets import _optional_inner, check_tree
    from vidgen.queue.workflow import ContactSheetStep, ShotSpec, StitchStep

    def float_keys(schema, prefix=""):
        for f in dataclasses.fields(schema):
            tp = _optional_inner(get_type_hints(schema)[f.name])
            if dataclasses.is_dataclass(tp):
                yield from float_keys(tp, f"{prefix}{f.name}.")
            elif tp is float:
                yield prefix + f.name

    tops = (RenderConfig, LoraConfig, ShotSpec, StitchStep, ContactSheetStep)
    keys = [(top, key) for top in tops for key in float_keys(top)]
    assert len(keys) == 16, keys    # sampling (4), speed (1), guard (2), audio.offset, control.scale, video2video.strength,
    #                                 forcing.addnoise_condition, parallel.timeout, a LoRA's strength, seconds, crossfade,
    #                                 steps.stitch.audio.offset
    for top, key in keys:
        for bad in (float("nan"), float("inf"), "-inf", 10**400):
            raw: dict = {}
            *parents, leaf = key.split(".")
            node = raw
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = bad
            problems: list[str] = []
            check_tree(top, raw, "", problems)
            assert problems == [f"{key}: {bad!r} is not a finite number; NaN and infinities are refused"], (key, problems)


def test_workflow_text_is_never_resolved(simple, monkeypatch):
    """A shot's escaped `\\${oc.env:...}` is the text `${oc.env:...}` in its job's payload, and stays that
    text when the worker loads the payload; a workflow's own `${key}` reference is filled in once; a
    resolver is refused."""
    monkeypatch.setenv("VIDGEN_TEST_SECRET", "hunter2")
    path = simple(textwrap.dedent("""\
      - {name: a, prompt: 'a fox \\${oc.env:VIDGEN_TEST_SECRET} #1: yes', seed: 1}
      - {name: b, prompt: "${shots[0].prompt}", seed: 2, overrides: {negative_prompt: 'no \\${x}'}}
    """))
    wf = load_workflow(path, ["negative_prompt=${oc.env:VIDGEN_TEST_SECRET}"])     # text: a string key's value
    text = "a fox ${oc.env:VIDGEN_TEST_SECRET} #1: yes"
    jobs = plan_jobs(wf)
    assert [load_config(j.payload).prompt for j in jobs[:2]] == [text, text]
    assert [load_config(j.payload).negative_prompt for j in jobs[:2]] == ["${oc.env:VIDGEN_TEST_SECRET}"] * 2
    assert "hunter2" not in str([j.payload for j in jobs])
    path.write_text(path.read_text().replace("\\${oc.env", "${oc.env"))
    assert any("calls a resolver" in p for p in problems_of(path))


def test_shot_config_problems_carry_the_shot_and_defaults_problems_come_once(simple):
    path = simple(textwrap.dedent("""\
      - {name: one, prompt: a red circle moving right on a black background, overrides: {size: 65x64}}
      - {name: two, prompt: a red circle moving right on a black background, sead: 3}
      - {prompt: a red circle moving right on a black background, overrides: {seed: 4, sampling.stepz: 3}}
    """))
    path.write_text(path.read_text().replace(f"  config: {DEMO}\n", f"  config: {DEMO}\n  guidance: 2\n"))
    problems = problems_of(path)
    assert sum(p.startswith("defaults: guidance: unknown key") for p in problems) == 1
    assert any(p.startswith("shots[0] (one): size: '65x64' is not a multiple of 16") for p in problems)
    assert any(p.startswith("shots[1].sead: unknown key; did you mean shots[1].seed?") for p in problems)
    assert any(p.startswith("shots[2].overrides.seed: use the shot's own `seed:`") for p in problems)
    assert any("sampling.stepz: unknown key; did you mean sampling.steps?" in p for p in problems)
    assert len(problems) == 5, problems


@pytest.mark.parametrize("where, text, message", [
    ("stitch", "/tmp/elsewhere.mp4", "is an absolute path"),
    ("stitch", "../escape.mp4", "contains '..'"),
    ("stitch", "final/../../escape.mp4", "contains '..'"),
    ("sheet", "../sheet.png", "contains '..'"),
    ("sheet", "/tmp/sheet.png", "is an absolute path"),
    ("name", "../evil", "contains '..'"),
    ("name", "/etc/passwd", "is an absolute path"),
    ("name", "sub/dir", "is not a plain file name"),
    ("override", "/tmp/x.mp4", "set by the workflow"),
])
def test_paths_cannot_leave_output_dir(simple, where, text, message):
    name = text if where == "name" else "ok"
    override = f", overrides: {{output.path: {text}}}" if where == "override" else ""
    stitch = text if where == "stitch" else "all.mp4"
    sheet = text if where == "sheet" else "sheet.png"
    path = simple(f"  - {{name: '{name}', prompt: a red circle moving right on a black background{override}}}\n"
                  f"steps:\n  stitch: {{output: '{stitch}'}}\n  contact_sheet: {{output: '{sheet}'}}\n")
    problems = problems_of(path)
    assert len(problems) == 1 and message in problems[0], problems


def test_symlink_out_of_output_dir_is_refused(simple, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out" / "link").symlink_to(tmp_path / "elsewhere")
    path = simple(shots_yaml("a", extra="steps:\n  stitch: {output: link/all.mp4}\n"))
    assert "through a symbolic link" in problems_of(path)[0]


def test_relative_output_dir_and_subfolders_are_fine(simple, tmp_path):
    path = simple(shots_yaml("a", "b", extra="steps:\n  stitch: {output: final/all.mp4}\n"), output_dir="runs/x")
    wf = load_workflow(path)
    assert wf.output_dir == tmp_path / "runs" / "x"
    assert plan_jobs(wf)[-1].output == str(tmp_path / "runs" / "x" / "final" / "all.mp4")


@pytest.mark.parametrize("seconds, fps, frames, noted", [
    (2, 8, 17, True), (1, 8, 9, True), (0.5, 8, 5, True), (3, 8, 25, True), (1, 16, 17, True),
    (0.125, 8, 1, False), (2.125, 8, 17, False),
])
def test_seconds_become_4k_plus_1_frames(simple, seconds, fps, frames, noted):
    path = simple(f"  - {{name: s, prompt: a red circle moving right on a black background, seconds: {seconds}, "
                  f"overrides: {{fps: {fps}}}}}\n")
    wf = load_workflow(path)
    assert wf.shots[0].config.num_frames == frames
    assert bool(wf.notes) == noted
    if noted:
        assert f"rendering {frames}" in wf.notes[0]


def test_seconds_and_num_frames_together_is_a_problem(simple):
    path = simple("  - {prompt: a red circle moving right on a black background, seconds: 2, num_frames: 17}\n")
    # an unnamed shot is named by a slug of its prompt (at most 32 characters, cut between words)
    assert problems_of(path) == ["shots[0] (a-red-circle-moving-right-on-a): give num_frames or seconds, not both"]


def test_overrides_apply_to_every_shot_and_cannot_move_outputs(simple):
    path = simple(shots_yaml("a", "b"))
    wf = load_workflow(path, ["sampling.steps=3"])
    assert [s.config.sampling.steps for s in wf.shots] == [3, 3]
    assert problems_of(path, ["output.path=/tmp/x.mp4"]) == [
        "overrides: output.path: set by the workflow (every output goes under output_dir); remove it"]


# ------------------------------------------------------------------------------- planning


def test_plan_jobs_deps_and_paths(simple, tmp_path):
    path = simple(shots_yaml("first", "second", "third",
                             extra="steps:\n  stitch: {output: all.mp4, crossfade: 0.25}\n"
                                   "  contact_sheet: {output: sheet.png, columns: 2, labels: false}\n"))
    jobs = plan_jobs(load_workflow(path))
    out = tmp_path / "out"
    shots = [str(out / "shots" / f"0{i + 1}-{n}.mp4") for i, n in enumerate(("first", "second", "third"))]
    assert [(j.kind, j.deps, j.output, j.group) for j in jobs] == [
        ("render", [], shots[0], "test"), ("render", [], shots[1], "test"), ("render", [], shots[2], "test"),
        ("stitch", [0, 1, 2], str(out / "all.mp4"), "test"),
        ("contact_sheet", [0, 1, 2], str(out / "sheet.png"), "test")]
    render = jobs[1].payload
    cfg = load_config(render)  # the payload is a complete, valid render config
    assert cfg.output.path == shots[1] and cfg.seed == 1 and cfg.size == "64x64"
    assert cfg.output.root == str(out) and not cfg.output.overwrite    # every write confined to output_dir
    assert jobs[3].payload == {"inputs": shots, "output": str(out / "all.mp4"), "fps": 8, "crossfade": 0.25,
                               "crf": 18, "pix_fmt": "auto", "overwrite": False, "root": str(out), "joins": None,
                               "blends": None, "audio": None, "timeline": None, "names": ["first", "second", "third"],
                               "codec": "auto", "profile": None, "provenance": None}
    assert jobs[4].payload == {"inputs": shots, "output": str(out / "sheet.png"), "columns": 2, "labels": None,
                               "overwrite": False, "root": str(out)}


def test_plan_single(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    [job] = plan_single(DEMO, ["output.path=outputs/x-{seed}.mp4", "seed=5"])
    assert job.kind == "render" and job.deps == []
    assert job.payload["output"]["path"] == str(ROOT / "outputs" / "x-5.mp4")    # fixed at submit: idempotent
    assert job.payload["model"]["path"] == str(ROOT / "samples" / "demo-wan")
    with pytest.raises(ConfigError, match="nope.png' does not exist"):
        plan_single(DEMO, ["image=nope.png"])


def test_plan_single_expands_home(tmp_path, monkeypatch):
    """~ in a path is the user's home, as in a direct render (not a folder named ~ in the cwd)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "demo-wan").symlink_to(ROOT / "samples" / "demo-wan")
    monkeypatch.chdir(ROOT)
    [job] = plan_single(DEMO, ["output.path=~/renders/x-{seed}.mp4", "seed=5", "model.path=~/models/demo-wan"])
    assert job.payload["output"]["path"] == str(tmp_path / "renders" / "x-5.mp4")
    assert job.payload["model"]["path"] == str(tmp_path / "models" / "demo-wan")


# ------------------------------------------------------------------------------- executors


def solid_clip(path: Path, colour, frames: int = 5, size=(32, 32), fps: int = 8) -> str:
    with VideoWriter(path, fps=fps, width=size[0], height=size[1]) as writer:
        for _ in range(frames):
            writer.write(np.full((size[1], size[0], 3), colour, np.uint8))
    return str(path)


def mean_colours(path) -> np.ndarray:
    return np.stack([f.reshape(-1, 3).mean(0) for f in read_frames(path)])


@pytest.fixture
def clips(tmp_path):
    return [solid_clip(tmp_path / f"{i}.mp4", c) for i, c in enumerate((RED, GREEN, BLUE))]


def test_stitch_without_crossfade(clips, tmp_path):
    seen = []
    out = run_stitch({"inputs": clips, "output": str(tmp_path / "o" / "all.mp4"), "fps": 8},
                     progress=lambda step, total: seen.append((step, total)))
    got = mean_colours(out)
    assert len(got) == 15 and read_video_info(out)["fps"] == 8
    expected = np.array([RED] * 5 + [GREEN] * 5 + [BLUE] * 5, float)
    assert np.abs(got - expected).max() < 8
    assert seen[-1] == (15, 15) and len(seen) == 15
    assert sorted(os.listdir(out.parent)) == ["all.mp4"]  # no partial file left


def test_stitch_with_crossfade_blends_the_seams(clips, tmp_path):
    out = run_stitch({"inputs": clips, "output": str(tmp_path / "all.mp4"), "fps": 8, "crossfade": 0.25})
    got = mean_colours(out)
    red, green, blue = (np.array(c, float) for c in (RED, GREEN, BLUE))
    # 2 frames of crossfade at each of the 2 seams: 15 - 4 frames; weights 1/3 and 2/3 of the next shot.
    expected = [red] * 3 + [red * 2 / 3 + green / 3, red / 3 + green * 2 / 3] + [green] + \
        [green * 2 / 3 + blue / 3, green / 3 + blue * 2 / 3] + [blue] * 3
    assert len(got) == 11
    assert np.abs(got - np.stack(expected)).max() < 8


def test_stitch_replaces_an_existing_output_atomically_only_with_overwrite(clips, tmp_path):
    out = tmp_path / "all.mp4"
    out.write_bytes(b"old")
    (tmp_path / ".all.partial.mp4").write_bytes(b"left by a killed run")
    with pytest.raises(OutputError, match="already exists"):
        run_stitch({"inputs": clips[:2], "output": str(out), "fps": 8})
    assert out.read_bytes() == b"old"
    run_stitch({"inputs": clips[:2], "output": str(out), "fps": 8, "overwrite": True})
    assert read_video_info(out)["frames"] == 10
    # a temporary this run did not create is not its to delete
    assert (tmp_path / ".all.partial.mp4").read_bytes() == b"left by a killed run"


def test_stitch_of_mismatched_clips_fails_cleanly(clips, tmp_path):
    odd = solid_clip(tmp_path / "wide.mp4", WHITE, size=(48, 32))
    fast = solid_clip(tmp_path / "fast.mp4", WHITE, fps=16)
    out = tmp_path / "out" / "all.mp4"
    with pytest.raises(InputError, match=r"same size and fps .* 0.mp4 32x32@8, wide.mp4 48x32@8"):
        run_stitch({"inputs": [clips[0], odd], "output": str(out), "fps": 8})
    with pytest.raises(InputError, match=r"same size and fps .*fast.mp4 32x32@16"):
        run_stitch({"inputs": [clips[0], fast], "output": str(out), "fps": 8})
    with pytest.raises(InputError, match="has 1 frames; the crossfade of 2 frames needs at least 4"):
        run_stitch({"inputs": [clips[0], solid_clip(tmp_path / "one.mp4", WHITE, frames=1), clips[1]],
                    "output": str(out), "fps": 8, "crossfade": 0.25})
    with pytest.raises(InputError, match="does not exist"):
        run_stitch({"inputs": [clips[0], str(tmp_path / "nope.mp4")], "output": str(out), "fps": 8})
    assert not out.exists() and not any(p.name.startswith(".") for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("labels", [False, True])
def test_contact_sheet_grid(clips, tmp_path, labels):
    inputs = clips + [solid_clip(tmp_path / "w.mp4", WHITE), solid_clip(tmp_path / "y.mp4", YELLOW)]
    names = ["red", "green", "blue", "white", "yellow"] if labels else None
    out = run_contact_sheet({"inputs": inputs, "output": str(tmp_path / "s" / "sheet.png"), "columns": 2,
                             "labels": names})
    sheet = np.asarray(Image.open(out).convert("RGB")).astype(int)
    row = 32 + (LABEL_HEIGHT if labels else 0)
    assert sheet.shape == (3 * row, 2 * 32, 3)  # 5 shots in 2 columns: 3 rows
    for n, colour in enumerate((RED, GREEN, BLUE, WHITE, YELLOW)):
        y, x = (n // 2) * row + 16, (n % 2) * 32 + 16
        assert np.abs(sheet[y, x] - colour).max() < 8, (n, sheet[y, x])
    assert sheet[2 * row + 16, 48].max() < 40  # the sixth cell is empty
    if labels:  # caption pixels are drawn in the strip under the first cell
        assert sheet[32:row, :32].max() > 150
    assert sorted(os.listdir(out.parent)) == ["sheet.png"]


def test_planned_jobs_run_end_to_end(tiny_model, tmp_path, monkeypatch):
    """The render payloads render as they are (tiny stand-in model), and the stitch joins the results."""
    monkeypatch.chdir(tmp_path)
    path = write_workflow(tmp_path, f"""\
        name: e2e
        output_dir: out
        defaults: {{model.path: {tiny_model()}, model.device: cpu, size: 32x32, fps: 8, sampling.steps: 2}}
        shots:
          - {{name: one, prompt: a red circle moving right, seconds: 0.5, seed: 1}}
          - {{name: two, prompt: a blue square moving up, num_frames: 9, seed: 2}}
        steps:
          stitch: {{output: all.mp4, crossfade: 0.125}}
          contact_sheet: {{output: sheet.png}}
        """)
    import vidgen

    jobs = plan_jobs(load_workflow(path))
    for job in jobs[:2]:
        assert vidgen.render(job.payload).path == Path(job.output)
    assert read_video_info(run_stitch(jobs[2].payload))["frames"] == 5 + 9 - 1
    assert Image.open(run_contact_sheet(jobs[3].payload)).size == (2 * 32, 32 + LABEL_HEIGHT)


def test_a_shot_without_a_seed_gets_one_fixed_at_planning(tmp_path, monkeypatch):
    """Every attempt of the job must render the same clip, so a null seed is drawn once, at submit."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "wf.yaml"
    path.write_text(f"name: free\noutput_dir: out\ndefaults:\n  config: {DEMO}\n  seed: null\nshots:\n"
                    "  - {name: free, prompt: a red circle moving right on a black background}\n")
    wf = load_workflow(path)
    seed = plan_jobs(wf)[0].payload["seed"]
    assert wf.shots[0].config.seed is None and isinstance(seed, int) and 0 <= seed < 2**31


def test_shot_loras_replace_the_defaults(tmp_path, monkeypatch):
    """A shot's `loras:` replaces the defaults' list ([] = none); paths are stored absolute;
    a typo inside a shot's LoRA entry is reported with its place."""
    monkeypatch.chdir(tmp_path)
    body = f"""\
        name: t
        output_dir: out
        defaults:
          config: {DEMO}
          loras: [{{path: character.safetensors, strength: 0.8}}]
        shots:
          - {{name: a, prompt: a red circle moving right on a black background}}
          - {{name: b, prompt: a red circle moving left on a black background, loras: []}}
          - {{name: c, prompt: a red circle moving up on a black background, loras: [{{path: style.safetensors}}]}}
        """
    wf = load_workflow(write_workflow(tmp_path, body))
    got = [[(lora.path, lora.strength) for lora in s.config.loras] for s in wf.shots]
    assert got == [[(str(tmp_path / "character.safetensors"), 0.8)], [], [(str(tmp_path / "style.safetensors"), 1.0)]]
    bad = write_workflow(tmp_path, body.replace("{path: style.safetensors}", "{path: style.safetensors, strenght: 1}"))
    assert any("shots[2].loras[0].strenght: unknown key" in p for p in problems_of(bad))


def test_text_no_file_can_hold_is_refused_in_a_workflow(tmp_path, monkeypatch):
    """A workflow sent as JSON (the service writes a submitted mapping to a file) can hold NUL (a lone
    surrogate is a YAML error there); every such string is named at once, before any path is made of it."""
    import json

    monkeypatch.chdir(tmp_path)
    doc = {"name": "w\x00", "output_dir": "out\x00", "defaults": {"config": str(DEMO)},
           "shots": [{"name": "a", "prompt": "a fox\x00"}], "steps": {"stitch": {"output": "x\x00.mp4"}}}
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(doc))
    problems = problems_of(path)
    assert [p.split(":")[0] for p in problems] == ["name", "output_dir", "shots[0].prompt", "steps.stitch.output"]
