"""The CLI: bad input gives exit 2 with one line and no traceback, and leaves no output file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vidgen.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _write_cfg(tmp_path: Path, cfg: dict) -> str:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _run(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _assert_bad_input(code, err, out_path: Path, *needles):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("vidgen: error:"), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not out_path.exists()
    assert not list(out_path.parent.glob(".*partial*")) if out_path.parent.exists() else True


@pytest.fixture
def cfg_file(base_cfg, tmp_path):
    cfg = base_cfg()
    return _write_cfg(tmp_path, cfg), Path(cfg["output"]["path"])


BAD_OVERRIDES = {
    "unknown key": (["sampling.stpes=4"], ["sampling.stpes: unknown key", "did you mean sampling.steps"]),
    "wrong type": (["sampling.steps=ten"], ["sampling.steps: 'ten' is not an integer"]),
    "bad choice": (["sampling.solver=unipx"], ["did you mean 'unipc'"]),
    "missing model": (["model.path=/nonexistent/wan"], ["'/nonexistent/wan' does not exist"]),
    "odd size": (["size=65x64"], ["size: '65x64' is not a multiple of 16"]),
    "frames": (["num_frames=10"], ["num_frames: 10 is not 4k+1", "nearest valid: 9"]),
    "two at once": (["sampling.steps=0", "fps=0"], ["sampling.steps: 0", "fps: 0"]),
    "t2v with image": (["image=x.png"], ["text-to-video"]),
    "codec vs extension": (["output.codec=vp9"], ["does not match codec vp9"]),
    "not key=value": (["steps"], ["is not KEY=VALUE"]),
    "bad budget": (["vae.memory_budget=lots"], ["vae.memory_budget: 'lots' is not a size"]),
    "budget below minimum": (["vae.memory_budget=1KiB"], ["is below the minimum for a 64x64 frame"]),
    "unknown kernels": (["vae.kernels=cuda"], ["vae.kernels: 'cuda' is not allowed", "auto, torch, reference, triton, metal"]),
    "kernels the device lacks": (["vae.kernels=metal"], ["vae.kernels: metal runs on Apple GPUs (mps)", "use auto"]),
}


@pytest.mark.parametrize("case", list(BAD_OVERRIDES))
def test_bad_overrides_exit_2(capsys, cfg_file, case):
    path, out = cfg_file
    overrides, needles = BAD_OVERRIDES[case]
    code, _, err = _run(capsys, ["render", path, *overrides])
    _assert_bad_input(code, err, out, *needles)


def test_bad_yaml_key_in_file(capsys, base_cfg, tmp_path):
    cfg = base_cfg()
    cfg["sampling"]["guidance"] = 3
    cfg["model"]["dtype"] = 16
    code, _, err = _run(capsys, ["render", _write_cfg(tmp_path, cfg)])
    _assert_bad_input(code, err, Path(cfg["output"]["path"]), "2 problems", "sampling.guidance: unknown key",
                      "model.dtype: '16' is not allowed")


def test_missing_config_file(capsys, tmp_path):
    code, _, err = _run(capsys, ["render", str(tmp_path / "nope.yaml")])
    _assert_bad_input(code, err, tmp_path / "x.mp4", "does not exist")


def test_unwritable_output(capsys, cfg_file, tmp_path):
    path, _ = cfg_file
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a folder should be")
    out = blocker / "clip.mp4"
    code, _, err = _run(capsys, ["render", path, f"output.path={out}"])
    assert code == 2 and "cannot write in" in err and blocker.read_text().startswith("a file")
    assert len(err.strip().splitlines()) == 1


def test_existing_output_is_kept(capsys, cfg_file):
    path, out = cfg_file
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(b"user's video")
    code, _, err = _run(capsys, ["render", path])
    assert code == 2 and "already exists" in err and out.read_bytes() == b"user's video"


def test_incomplete_model_folder_lists_everything_missing(capsys, cfg_file, tiny_model, tmp_path):
    path, out = cfg_file
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model("wan2.1-t2v"), broken)
    (broken / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    shutil.rmtree(broken / "tokenizer")
    code, _, err = _run(capsys, ["render", path, f"model.path={broken}"])
    _assert_bad_input(code, err, out, "incomplete", "vae/*.safetensors", "tokenizer")


def test_pickle_weights_are_refused(capsys, cfg_file, tiny_model, tmp_path):
    path, out = cfg_file
    broken = tmp_path / "pickled"
    shutil.copytree(tiny_model("wan2.1-t2v"), broken)
    st = broken / "transformer" / "diffusion_pytorch_model.safetensors"
    st.rename(st.with_suffix(".bin"))
    code, _, err = _run(capsys, ["render", path, f"model.path={broken}"])
    _assert_bad_input(code, err, out, "only pickle weights", "safetensors only")


def test_unreadable_image(capsys, base_cfg, tmp_path):
    cfg = base_cfg("wan2.2-ti2v-5b")
    bad = tmp_path / "not-an-image.png"
    bad.write_text("hello")
    code, _, err = _run(capsys, ["render", _write_cfg(tmp_path, cfg), f"image={bad}"])
    _assert_bad_input(code, err, Path(cfg["output"]["path"]), "cannot read")


def test_i2v_needs_image(capsys, base_cfg, tmp_path):
    cfg = base_cfg("wan2.2-i2v-a14b")
    code, _, err = _run(capsys, ["render", _write_cfg(tmp_path, cfg)])
    _assert_bad_input(code, err, Path(cfg["output"]["path"]), "needs image=PATH")


def test_decode_rejects_non_latents(capsys, tmp_path):
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"\x00" * 16)
    code, _, err = _run(capsys, ["decode", str(bad)])
    _assert_bad_input(code, err, tmp_path / "x.mp4", "cannot read")


def test_config_show_and_info(capsys, cfg_file):
    path, _ = cfg_file
    code, out, _ = _run(capsys, ["config", "show", path, "sampling.steps=3"])
    assert code == 0 and "steps: 3" in out and "solver: unipc" in out
    code, out, _ = _run(capsys, ["info"])
    assert code == 0 and "torch" in out and "devices: cpu" in out


def test_subprocess_render_and_bad_input(cfg_file, tmp_path):
    """The installed entry point: real exit codes, and a render that PyAV plays back."""
    from vidgen.io import read_video_info

    path, out = cfg_file
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    bad = subprocess.run([sys.executable, "-m", "vidgen", "render", path, "fps=fast"], capture_output=True,
                         text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "vidgen: error: invalid config in " + path + ": fps: 'fast' is not an integer"]
    ok = subprocess.run([sys.executable, "-m", "vidgen", "render", path, "-q"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    info = read_video_info(out)
    assert (info["frames"], info["width"], info["height"], round(info["fps"])) == (9, 64, 64, 8)


def test_options_and_overrides_in_any_order():
    from vidgen.cli import parse

    args = parse(["render", "cfg.yaml", "a=1", "-q", "seed=3", "b=2"])
    assert args.quiet and args.overrides == ["a=1", "seed=3", "b=2"]
    args = parse(["render", "cfg.yaml", "-q", "--resume=x.safetensors", "seed=3"])
    assert args.resume == "x.safetensors" and args.overrides == ["seed=3"]
    with pytest.raises(SystemExit):
        parse(["render", "cfg.yaml", "seed=3", "--nope"])


def test_light_commands_import_no_model_library(tmp_path, cfg_file):
    """`vidgen config show` and the queue's ledger commands read YAML and SQLite only: they do not
    import torch, diffusers or transformers (seconds of a CPU's time) to silence them; neither do a
    render or plan whose config is refused (issue 34: 8-10 s for a typo); one that goes on does."""
    from vidgen.queue.ledger import Ledger

    Ledger(tmp_path / "q.db")
    probe = ("import sys; from vidgen.cli import main; code = main(sys.argv[1:]); "
             "print('\\nimported:', sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules)); "
             "sys.exit(code)")
    root = Path(__file__).resolve().parents[1]
    db = str(tmp_path / "q.db")
    for argv in (["config", "show", str(root / "configs" / "demo.yaml")], ["queue", "--db", db, "list"],
                 ["queue", "--db", db, "pause"]):
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=root)
        assert done.returncode == 0, done.stderr
        assert done.stdout.rstrip().endswith("imported: []"), (argv, done.stdout[-300:])
    for argv in (["render", str(tmp_path / "none.yaml")], ["render", str(root / "configs" / "demo.yaml"),
                 "sampling.stpes=3"], ["plan", str(root / "configs" / "demo.yaml"), "size=65x64"],
                 ["queue", "--db", db, "submit", str(root / "configs" / "demo.yaml"), "fps=fast"]):
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=root)
        assert done.returncode == 2 and done.stdout.rstrip().endswith("imported: []"), (argv, done.stdout[-300:])
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    # a command that goes on to models silences the libraries first
    probe = probe.replace("sys.exit(code)", "import transformers.utils.logging as t; print('verbosity', t.get_verbosity()); "
                                            "sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", probe, "plan", cfg_file[0]], capture_output=True, text=True, cwd=root)
    assert done.returncode == 0 and "imported: ['diffusers', 'torch', 'transformers']" in done.stdout, done.stdout
    assert done.stdout.rstrip().endswith("verbosity 40"), done.stdout[-300:]      # logging.ERROR


def test_ctrl_c_while_sampling_checkpoints_and_prints_the_resume_command(capsys, caplog, cfg_file, monkeypatch):
    """The first Ctrl-C stops after the current step with a checkpoint, and the last line is the exact
    command that resumes; running it finishes the clip."""
    import shlex
    import signal

    import vidgen.cli as cli

    path, out = cfg_file
    real = cli._Bars.__call__

    def press_ctrl_c(self, p):
        real(self, p)
        if p.stage == "denoise" and p.step == 3 and not getattr(self, "pressed", False):
            self.pressed = True
            os.kill(os.getpid(), signal.SIGINT)      # as the terminal does: handled between two bytecodes

    monkeypatch.setattr(cli._Bars, "__call__", press_ctrl_c)
    code, stdout, err = _run(capsys, ["render", path, "sampling.steps=8", "sampling.checkpoint_every=100",
                                      "prompt=a fox's tail in the snow", "-q"])
    last = err.strip().splitlines()[-1]
    assert code == 130 and "Traceback" not in err and not out.exists(), err
    assert last.startswith("vidgen: interrupted at step 3 of 8; resume with: vidgen render "), last
    argv = shlex.split(last.split("resume with: ", 1)[1])
    checkpoint = Path(argv[-1].removeprefix("--resume="))
    assert checkpoint.is_file() and argv[1:-1] == ["render", path, "sampling.steps=8", "sampling.checkpoint_every=100",
                                                   "prompt=a fox's tail in the snow", "-q"], argv
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler        # the handler is put back
    monkeypatch.setattr(cli._Bars, "__call__", real)
    caplog.set_level("INFO", logger="vidgen")
    code, stdout, err = _run(capsys, argv[1:])
    assert code == 0 and out.exists() and f"resuming {checkpoint} at step 3 of 8" in caplog.text, err
    assert not checkpoint.exists()


def test_output_into_a_pipe_whose_reader_left_ends_quietly(tmp_path, cfg_file):
    """`vidgen queue show 1 | head` ended in "internal error: BrokenPipeError": any command whose
    reader has gone stops without a word (exit 141, as for SIGPIPE)."""
    from vidgen.queue.ledger import JobSpec, Ledger

    db = str(tmp_path / "q.db")
    Ledger(db).submit([JobSpec(kind="render", payload={"prompt": "x"}, name="x" * 50, output=str(tmp_path / "x.mp4"))])
    root = Path(__file__).resolve().parents[1]
    for argv in (["queue", "--db", db, "show", "1"], ["queue", "--db", db, "list"], ["config", "show", cfg_file[0]]):
        read, write = os.pipe()
        os.close(read)                  # the reader is gone before the first write
        try:
            done = subprocess.run([sys.executable, "-m", "vidgen", *argv], stdout=write, stderr=subprocess.PIPE,
                                  text=True, cwd=root)
        finally:
            os.close(write)
        assert (done.returncode, done.stderr) == (141, ""), (argv, done.stderr)


def test_cpu_threads_for_small_clips_and_busy_machines(monkeypatch):
    """torch's default (a thread per core) made the demo's denoise 15-25x slower on a busy machine:
    a small clip gets one thread, a large one a thread per Mi pixels up to the usable cores, whatever
    the load (a count from the load average would change a seed's bits from run to run: torch sums
    full reductions in another order on another thread count); OMP_NUM_THREADS set by the user wins."""
    from vidgen import threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    load = [0.0]
    monkeypatch.setattr(os, "getloadavg", lambda: (load[0], 0.0, 0.0))
    assert threads.cpu_threads(64, 64, 17) == (1, "a small clip")                    # the demo
    assert threads.cpu_threads(832, 480, 81) == (8, "every core")                     # 480p: all 8 usable
    assert threads.cpu_threads(512, 512, 9)[0] == 2
    load[0] = 100.0                         # a busy machine: the same count, the same bits
    assert threads.cpu_threads(832, 480, 81) == (8, "every core")
    assert threads.cpu_threads(64, 64, 17) == (1, "a small clip")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert threads.cpu_threads(64, 64, 17) is None


def test_a_broken_environment_is_one_line_not_an_internal_error(cfg_file, tmp_path):
    """A package that does not import (here diffusers' Wan transformer, as when a folder shadowed
    Hugging Face's `kernels`, issue 34) is named in one line, exit 2, not a multi-line internal error."""
    from test_queue import _broken_environment

    done = subprocess.run([sys.executable, "-m", "vidgen", "render", cfg_file[0], "-q"], capture_output=True,
                          text=True, env=_broken_environment(tmp_path))
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        "vidgen: error: this Python environment cannot run it: ImportError: broken on purpose: "
        "diffusers.models.transformers.transformer_wan (--debug shows where)"), done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
