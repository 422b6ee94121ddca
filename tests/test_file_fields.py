"""The config's file-bearing fields are marked once, in the schema (config.FileMark), and every reader of
them takes them from there: the service's roots, a queued job's absolute paths, the pre-planning check."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from pathlib import Path

import vidgen.config as config
from vidgen.config import to_dict
from vidgen.config_files import file_fields, file_marks
from vidgen.queue.service import Service, _named_files
from vidgen.queue.workflow import plan_single

# Fields whose docstring speaks of a file, folder, image or path but whose value names none, each with why.
NOT_FILES = {
    ("VaeConfig", "dtype"): "a dtype",
    ("RenderConfig", "image_fit"): "how the image is fitted",
    ("ModelConfig", "variant"): "a family name, read from the folder",
    ("SamplingConfig", "schedule"): "a timestep grid's name",
    ("SamplingConfig", "shift"): "a number (null: the model folder's)",
    ("OutputConfig", "overwrite"): "a yes/no about output.path",
    ("OutputConfig", "root"): "a limit on where output.path's files go (paths.confine), not a file",
    ("GuardConfig", "action"): "what happens to output.path",
    ("LoraConfig", "sha256"): "a digest of loras[].path",
    ("RenderConfig", "loras"): "a list of sections; their path is marked",
    ("OutputConfig", "fps"): "the delivered file's frame rate",
}


def _field_docs() -> dict[tuple[str, str], str]:
    """(class, field) -> the docstring under the field, read from the schema's source (config.py and the
    sections it re-exports, output_config.py and animate_config.py)."""
    docs = {}
    sources = [Path(config.__file__), Path(config.__file__).with_name("output_config.py"),
               Path(config.__file__).with_name("animate_config.py")]
    for cls in (node for source in sources for node in ast.parse(source.read_text()).body):
        if isinstance(cls, ast.ClassDef):
            for node, doc in zip(cls.body, cls.body[1:]):
                if (isinstance(node, ast.AnnAssign) and isinstance(doc, ast.Expr)
                        and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
                    docs[cls.name, node.target.id] = doc.value.value
    return docs


def test_a_field_whose_docstring_names_a_file_is_marked():
    marked = {(cls.__name__, f.name) for cls in vars(config).values() if dataclasses.is_dataclass(cls)
              for f in dataclasses.fields(cls) if "file" in f.metadata}
    words = re.compile(r"\b(files?|folders?|images?|paths?)\b", re.I)
    speaks = {key for key, doc in _field_docs().items() if words.search(doc)}
    assert speaks - marked - set(NOT_FILES) == set(), "mark these fields with config._file(...)"
    assert marked <= speaks and not marked & set(NOT_FILES)


def _every_file(tmp_path: Path) -> dict[str, str]:
    """A value, as a relative path that exists, for every field the schema marks."""
    values = {}
    for parts, mark in file_marks().items():
        key = ".".join(p if p is not None else "0" for p in parts).replace(".0", "[0]")
        name = f"files/{'-'.join(p for p in parts if p)}" + (mark.suffix or (".png" if mark.kind == "image" else ""))
        if mark.kind != "write":
            (tmp_path / name).parent.mkdir(exist_ok=True)
            (tmp_path / name).mkdir() if mark.kind == "folder" else (tmp_path / name).write_bytes(b"x")
        values[key] = name + (".mp4" if mark.kind == "write" else "")
    return values


def _overrides(values: dict[str, str]) -> list[str]:
    lists: dict[str, list] = {}
    plain = []
    for key, value in values.items():
        if "[0]" in key:
            head, _, tail = key.partition("[0]")
            lists.setdefault(head, []).append((tail.lstrip("."), value))
        else:
            plain.append(f"{key}={value}")
    for head, items in lists.items():
        entries = [v for t, v in items if not t] or [{t: v for t, v in items}]
        plain.append(f"{head}:={entries!r}".replace("'", '"'))
    return plain


def test_every_marked_field_is_listed_resolved_and_confined(tmp_path, monkeypatch):
    """Adding a file field to the schema (with its mark) is all it takes: file_fields lists it, the
    workflow stores it absolute, the service confines it to its roots and checks it before planning."""
    monkeypatch.chdir(tmp_path)
    values = _every_file(tmp_path)
    assert {"model.path", "model.transformer", "image", "last_image", "output.colour_reference", "output.path",
            "loras[0].path", "guard.blocklists[0]", "guard.classifier", "guard.engine_cache"} <= set(values)
    # animate.mode replace: the mode in which every driving video (background and mask too) is read
    [spec] = plan_single(None, ["prompt=a fox", "seed=1", "animate.mode=replace", *_overrides(values)])
    listed = {key: value for key, value, _ in file_fields(spec.payload)}
    assert set(listed) == set(values)
    for key, value in values.items():
        if key != "output.path":        # placed by plan_single (its template filled in)
            assert listed[key] == os.path.abspath(value), key
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    problems = Service(tmp_path / "q.db", [elsewhere], None, 1 << 20, 0.5).confine([spec])
    for key, value in listed.items():
        assert any(repr(value) in p and "outside the service's roots" in p for p in problems), key
    named = _named_files(spec.payload, [])
    assert sorted(named) == sorted(v for k, v in listed.items() if k != "output.path")


def test_names_repo_ids_and_empty_values_are_no_files():
    cfg = config.RenderConfig(prompt="x", model=config.ModelConfig(path="Wan-AI/Wan2.2-TI2V-5B-Diffusers"))
    cfg.guard.engine_cache = ""
    assert [k for k, _, _ in file_fields(cfg)] == ["output.path"]       # default blocklist, classifier: names
    assert file_fields(to_dict(cfg)) == file_fields(cfg)
