"""Reading configs: YAML presets with `defaults:` inheritance, dicts and dotlist overrides -> a
checked RenderConfig (vidgen.config).

Loading order: the `defaults:` files of a preset (recursively, in order), the preset itself, then
overrides (`sampling.steps=20` from the CLI, or keyword arguments in the API). Every problem in the
merged config is reported at once — unknown keys, wrong types, values out of range — with the key
path, the bad value and what is allowed, before any weights are read.

What is YAML and what is text: YAML files (presets, their `defaults:`) and `KEY:=VALUE` overrides
are YAML, and their `${key}` references are filled in once, when the config loads (resolvers such
as `${oc.env:...}` are refused). Everything else is text, taken as it is: the value of a
string-typed key given as `KEY=VALUE`, Python dicts and keyword arguments, a RenderConfig, a
stored config (a queued job's payload, a latents file's settings). OmegaConf would read `${` and
`???` in such text again at every copy into a node, so text is "shelved" (`shelve`) before it
enters one and taken back (`unshelve`) when it leaves: no user text is ever interpolated.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
from pathlib import Path, PurePath
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import GrammarParseError, OmegaConfBaseException
from omegaconf.grammar_parser import OmegaConfGrammarParser, parse as parse_interpolation

from .config import RenderConfig, canonical, to_dict
from .errors import ConfigError
from .records import path_problem

PRESETS = Path(__file__).resolve().parent.parent / "configs"
"""The shipped presets: a config's `defaults:` may name one of these, or a file beside the config."""
_CONFIG_SUFFIXES = (".yaml", ".yml")
# Text on its way through OmegaConf: NUL, a per-process nonce, the text's UTF-8 (surrogates kept) in hex,
# NUL. No user text holds it (NUL in a config value is refused), and OmegaConf leaves it alone.
_SHELF = f"\x00vidgen-text-{os.urandom(6).hex()}:"
_SHELVED = re.compile(re.escape(_SHELF) + r"([0-9a-f]*)\x00")


def yaml_error(name: str, e: Exception) -> ConfigError:
    """A YAML error as one line naming the position, never the file's text (it may not be a config)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    what = getattr(e, "problem", None) or type(e).__name__
    return ConfigError(f"{name} is not valid YAML{where}: {what}")


def _default_file(name: Any, path: Path) -> Path:
    """Where a `defaults:` entry of `path` points: a file beside it (its folder or below), else a
    shipped preset. Anything else (absolute, ~, '..', not .yaml, leaving the folder by a link) is
    refused, so a config never reads files outside its own folder and the presets."""
    allowed = f"name a .yaml file beside {path.name} or a shipped preset (e.g. base.yaml)"
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"defaults: in {path.name} must list file names; {allowed}")
    parts = PurePath(name).parts
    if PurePath(name).is_absolute() or name.startswith("~") or ".." in parts or not name.endswith(_CONFIG_SUFFIXES):
        raise ConfigError(f"defaults: {name!r} in {path.name} is refused; {allowed} "
                          "(no absolute paths, ~ or '..')")
    for folder in (path.parent, PRESETS):
        candidate = (folder / name).resolve()
        if candidate.is_relative_to(folder.resolve()) and candidate.is_file():
            return candidate
    raise ConfigError(f"defaults: {name!r} (named in {path.name}) does not exist beside it or among the shipped "
                      f"presets; {allowed}")


def _read_yaml(path: Path, chain: tuple[Path, ...] = ()) -> DictConfig:
    """Read one preset and, first, the files in its `defaults:` list (beside it, or shipped presets),
    merged in order."""
    path = path.resolve()
    if path in chain:
        raise ConfigError(f"defaults: {path.name} includes itself ({' -> '.join(p.name for p in chain + (path,))})")
    if problem := path_problem(path, "file"):        # stat only: a FIFO or device is never opened
        raise ConfigError(f"config file {str(path)!r} {problem}")
    try:
        raw = OmegaConf.load(path)
    except UnicodeDecodeError:
        raise ConfigError(f"{path.name} is not a text file; give a YAML config") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path.name} ({e.strerror or type(e).__name__})") from None
    except Exception as e:  # YAML syntax errors come in several classes
        raise yaml_error(path.name, e) from None
    if raw is None or isinstance(raw, ListConfig):
        raise ConfigError(f"{path.name} must be a mapping of keys (model:, prompt:, ...)")
    defaults = raw.pop("defaults", None) if "defaults" in raw else None
    if defaults is None:
        return raw
    if isinstance(defaults, str):
        defaults = [defaults]
    if not isinstance(defaults, (list, ListConfig)):
        raise ConfigError(f"defaults: in {path.name} must be a file name or a list of them")
    merged = OmegaConf.create()
    for name in defaults:
        merged = OmegaConf.merge(merged, _read_yaml(_default_file(name, path), chain + (path,)))
    return OmegaConf.merge(merged, raw)


def shelve(tree: Any) -> Any:
    """`tree` (plain values: final text) ready to enter an OmegaConf node: every string OmegaConf
    would read as more than text (`${`, `\\`, `???`) shelved, dataclasses as dicts."""
    if isinstance(tree, str):
        if "${" in tree or "\\" in tree or tree.endswith("???"):
            return f"{_SHELF}{tree.encode('utf-8', 'surrogatepass').hex()}\x00"
        return tree
    if isinstance(tree, dict):
        return {k: shelve(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [shelve(v) for v in tree]
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return shelve(dataclasses.asdict(tree))
    return tree


def unshelve(tree: Any) -> Any:
    """`tree` as it left OmegaConf (plain values or dataclass instances, changed in place) with its
    shelved text taken back."""
    if isinstance(tree, str):
        return _SHELVED.sub(lambda m: bytes.fromhex(m.group(1)).decode("utf-8", "surrogatepass"), tree) \
            if _SHELF in tree else tree
    if isinstance(tree, dict):
        return {k: unshelve(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [unshelve(v) for v in tree]
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        for f in dataclasses.fields(tree):
            object.__setattr__(tree, f.name, unshelve(getattr(tree, f.name)))
    return tree


def build(schema: type, plain: dict) -> Any:
    """`plain` (final text, already checked by check_tree) as an instance of the dataclass `schema`,
    through OmegaConf's conversions, with no `${...}` in it read as a reference."""
    return unshelve(OmegaConf.to_object(OmegaConf.merge(_blank(schema), shelve(plain))))


def _calls_resolver(text: str) -> bool:
    """Whether OmegaConf, resolving `text`, would call a resolver: parsed with OmegaConf's own grammar,
    so escapes (`\\${`, `\\\\${`) and resolver names built from references count as they would run."""
    if "${" not in text:
        return False
    try:
        tree = parse_interpolation(text)
    except GrammarParseError:
        return False        # not an interpolation OmegaConf can read: resolving it fails (reported then)
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, OmegaConfGrammarParser.InterpolationResolverContext):
            return True
        todo += list(node.getChildren()) if hasattr(node, "getChildren") else []
    return False


def resolver_problems(tree: Any, prefix: str = "") -> list[str]:
    """Every string in `tree` (a YAML document as OmegaConf holds it, unresolved) that calls an
    OmegaConf resolver (`${oc.env:HOME}` and the like).

    Configs take no resolvers: one could read the environment (secrets) into a prompt, a ledger
    payload or a video's metadata. Plain `${key}` references to other keys stay allowed.
    """
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in resolver_problems(v, f"{prefix}{k}.")]
    if isinstance(tree, list):
        return [p for i, v in enumerate(tree) for p in resolver_problems(v, f"{prefix.rstrip('.')}[{i}].")]
    if isinstance(tree, str) and _calls_resolver(tree):
        return [f"{prefix.rstrip('.')}: {tree!r} calls a resolver; vidgen configs take no resolvers (they could "
                "read the environment); write the value itself (a plain ${key} reference is allowed, and `\\${` is the "
                "text `${`)"]
    return []


def resolve(conf: DictConfig, label: str | None = None) -> dict:
    """`conf` as a plain dict of final text with its YAML's `${key}` references filled in (the one
    resolution a config gets; its text was never YAML); ConfigError for a resolver, a reference to a
    missing key, a reference loop or one of the wrong kind."""
    if problems := resolver_problems(OmegaConf.to_container(conf, resolve=False)):
        raise ConfigError(problems, label)
    return fill_in(conf, label)


def fill_in(conf: DictConfig, label: str | None = None) -> dict:
    """resolve() for a `conf` whose resolvers were refused already: its references filled in."""
    try:
        return unshelve(OmegaConf.to_container(conf, resolve=True))
    except OmegaConfBaseException as e:
        raise ConfigError(reference_problem(e, "config"), label) from None
    except RecursionError:
        raise ConfigError("a ${...} reference refers back to itself; remove the loop", label) from None


def reference_problem(e: Exception, key: str) -> str:
    """A `${...}` reference that cannot be filled in, as one line naming its key (else `key`)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"{getattr(e, 'full_key', None) or key}: cannot fill in its ${{...}} reference ({text})"


def overrides_conf(overrides: list[str] | tuple[str, ...] | dict | DictConfig | None) -> DictConfig:
    """Overrides as one OmegaConf node, for merging over a preset (see the module docstring).

    A list holds `KEY=VALUE` strings (and dicts, applied in their place): the VALUE of a
    string-typed key (prompt, negative_prompt, paths, names, choices) is that text, whole
    (`prompt=a fox #1: yes` is exactly that); other keys' values, and every `KEY:=VALUE`, are YAML
    (`seed=3`, `loras=[{path: a.safetensors}]`, `image:=null`). A dict (nested, or dotted keys)
    holds values, taken as they are. A DictConfig is an earlier result of this function, as it is.
    """
    if isinstance(overrides, DictConfig):
        return overrides
    if overrides is None or (isinstance(overrides, (list, tuple, dict)) and not overrides):
        return OmegaConf.create()
    if isinstance(overrides, (str, bytes)):
        raise ConfigError(f"overrides: {overrides!r} is a string; give a list of KEY=VALUE strings "
                          f"(overrides=[{overrides!r}]) or a dict")
    conf = OmegaConf.create()
    if isinstance(overrides, dict):
        try:
            for key, value in overrides.items():
                if not isinstance(key, str):
                    raise ConfigError(f"overrides: key {key!r} is not a string; use dotted names like 'sampling.steps'")
                if "." in key:  # API keyword with a dotted path, e.g. {"sampling.steps": 20}
                    OmegaConf.update(conf, key, shelve(value), merge=True)
                else:
                    conf = OmegaConf.merge(conf, {key: shelve(value)})
        except OmegaConfBaseException as e:
            raise ConfigError(f"overrides: {str(e).strip().splitlines()[0]}") from None
        return conf
    if not isinstance(overrides, (list, tuple)):
        raise ConfigError(f"overrides: expected a list of KEY=VALUE strings or a dict, got {type(overrides).__name__}")
    problems = []
    for o in overrides:
        if isinstance(o, dict):     # values among the strings (the API's keywords after a list)
            try:
                conf = OmegaConf.merge(conf, overrides_conf(o))
            except ConfigError as e:
                problems += e.problems
            continue
        key, eq, text = o.partition("=") if isinstance(o, str) else ("", "", "")
        as_yaml = key.endswith(":")
        key = key.removesuffix(":")
        if not eq or not key.strip():
            problems.append(f"override {o!r} is not KEY=VALUE (e.g. sampling.steps=20)")
            continue
        if not as_yaml and _is_text(_key_type(key)):
            value = shelve(text)       # text, whole: `#`, `:`, quotes, `yes`, spaces and all
        elif not as_yaml and not text.strip():
            problems.append(f"override {o!r} has no value; give one (or {key}:=null for null)")
            continue
        else:
            try:
                value = yaml.load(text, Loader=_yaml_loader())
                comment = _comment(text)
            except yaml.YAMLError as e:     # `loras=[{a: 1` is not YAML
                what = getattr(e, "problem", None) or type(e).__name__
                problems.append(f"override {o!r}: the value is not valid YAML ({what}); quote it or close its brackets")
                continue
            if comment:
                problems.append(f"override {o!r}: YAML would drop {comment!r} as a comment; quote the value "
                                "or remove the comment")
                continue
        try:
            OmegaConf.update(conf, key, value, merge=True)
        except OmegaConfBaseException as e:
            problems.append(f"override {o!r}: {str(e).strip().splitlines()[0]}")
    if problems:
        raise ConfigError(problems)
    return conf


def override_values(overrides: list[str] | tuple[str, ...] | dict | None) -> dict:
    """The overrides as plain values, exactly as load_config will take them (text as text, `KEY:=VALUE`
    as YAML, references unresolved): for checks that must see what a config will read (the service's
    roots check). {} when they do not parse (load_config then says why)."""
    try:
        return unshelve(OmegaConf.to_container(overrides_conf(overrides), resolve=False))
    except (ConfigError, OmegaConfBaseException):
        return {}


def _comment(text: str) -> str:
    """The first comment in a YAML value (what YAML drops unsaid), or ""."""
    if "#" not in text:
        return ""
    end = 0
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        gap = text[end:token.start_mark.index]
        if "#" in gap:
            return gap[gap.index("#"):].strip().splitlines()[0]
        end = max(end, token.end_mark.index)
    gap = text[end:]
    return gap[gap.index("#"):].strip().splitlines()[0] if "#" in gap else ""


def _yaml_loader():
    """The YAML loader OmegaConf reads dotlists with (its float and bool rules), else PyYAML's safe one."""
    try:
        from omegaconf._utils import get_yaml_loader

        return get_yaml_loader()
    except ImportError:     # a private name: an OmegaConf without it still parses YAML safely
        return yaml.SafeLoader


def _key_type(key: str, schema: type = RenderConfig) -> Any:
    """The schema type of a dotted override key (`output.path`, `loras[0].path`, `loras.0.path`); None
    for a key the schema does not have (check_tree names it)."""
    tp: Any = schema
    for part in re.findall(r"[^.\[\]]+|\[[^\]]*\]", key.strip()):
        index = part.startswith("[") or part.isdigit()
        if index:
            tp = _optional_inner(tp)
            if get_origin(tp) is not list:
                return None
            tp = get_args(tp)[0]
        else:
            tp = _optional_inner(tp)
            if not dataclasses.is_dataclass(tp):
                return None
            tp = get_type_hints(tp).get(part)
            if tp is None:
                return None
    return tp


def _optional_inner(tp: Any) -> Any:
    if get_origin(tp) is Union:
        inner = [a for a in get_args(tp) if a is not type(None)]
        return inner[0] if len(inner) == 1 else tp
    return tp


def _is_text(tp: Any) -> bool:
    """A string-typed schema field: str or Optional[str] (not a union with numbers, not Any)."""
    return tp is str or (get_origin(tp) is Union and set(get_args(tp)) == {str, type(None)})


def _describe(tp: Any) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if get_origin(tp) is Union:
        inner = [a for a in get_args(tp) if a is not type(None)]
        return " or ".join(_describe(a) for a in inner) + (" or null" if type(None) in get_args(tp) else "")
    if get_origin(tp) is list:
        return f"a list of {_describe(get_args(tp)[0]).removeprefix('a ').removeprefix('an ')}s, e.g. [a, b]"
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def check_tree(schema: type, raw: Any, prefix: str, problems: list[str]) -> None:
    """Report unknown keys and values of the wrong type, walking the user's (unstructured) config.

    Bad entries are removed from `raw` (a plain dict), so the remaining keys can still be checked
    for range and consistency and every problem is reported in one go.
    """
    hints = get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    values: dict[str, tuple[int, Any]] = {}    # key -> (where its problem goes, value): type-checked below
    for key in list(raw):
        value, path = raw[key], f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {prefix}{close[0]}? " if close else ""
            if len(path) > 60 or not path.isprintable():     # not a typo: don't echo what the file holds
                path = f"{path[:40].splitlines()[0]!r}..."
            problems.append(f"{path}: unknown key; {hint}allowed under {prefix.rstrip('.') or 'the top level'}: "
                            f"{', '.join(names)}")
            del raw[key]
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if isinstance(value, dict):
                check_tree(tp, value, path + ".", problems)
            else:
                problems.append(f"{path}: expected a mapping of keys ({', '.join(f.name for f in dataclasses.fields(tp))}), "
                                f"got {value!r}")
                del raw[key]
            continue
        item = _list_item(tp)
        if item is not None and value is not None:
            if not isinstance(value, list):
                problems.append(f"{path}: expected a list of mappings ({', '.join(f.name for f in dataclasses.fields(item))}), "
                                f"got {value!r}")
                del raw[key]
                continue
            kept = []
            for i, entry in enumerate(value):
                if isinstance(entry, dict):
                    check_tree(item, entry, f"{path}[{i}].", problems)
                    kept.append(entry)
                else:
                    problems.append(f"{path}[{i}]: expected a mapping of keys "
                                    f"({', '.join(f.name for f in dataclasses.fields(item))}), got {entry!r}")
            raw[key] = kept
            continue
        if isinstance(value, str) and value == "???":
            continue  # still missing: reported after the merge
        if _optional_inner(tp) is float and _not_finite(value):
            problems.append(f"{path}: {value!r} is not a finite number; NaN and infinities are refused")
            del raw[key]
            continue
        values[key] = len(problems), value
    # One merge checks every value of this level; only where it fails, each alone names the bad ones
    # (merges are slow: a full config has some 60 values).
    blank = _blank(schema)
    try:
        OmegaConf.merge(blank, shelve({key: value for key, (_, value) in values.items()}))
        return
    except OmegaConfBaseException:
        pass
    for key, (where, value) in reversed(values.items()):    # from the last: earlier places stay put
        try:
            OmegaConf.merge(blank, shelve({key: value}))
        except OmegaConfBaseException:
            problems.insert(where, f"{prefix}{key}: {value!r} is not {_describe(hints[key])}")
            del raw[key]


def _not_finite(value: Any) -> bool:
    """A number (or text OmegaConf reads as one: 'nan', '1e999') that is NaN or infinite."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return False
    try:
        return not math.isfinite(float(value))
    except ValueError:
        return False        # not a number at all: the type check says so
    except OverflowError:
        return True         # an integer beyond any float


@functools.cache
def _blank(schema: type) -> DictConfig:
    """The schema as an OmegaConf node (slow to build; merges copy it, never change it)."""
    return OmegaConf.structured(schema)


def _list_item(tp) -> type | None:
    """The dataclass of a list[dataclass] field's items, else None."""
    if get_origin(tp) is Union:         # Optional[list[...]]
        inner = [a for a in get_args(tp) if a is not type(None)]
        tp = inner[0] if len(inner) == 1 else tp
    args = get_args(tp)
    if get_origin(tp) is list and args and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def load_config(source: str | Path | dict | RenderConfig | None = None,
                overrides: list[str] | dict | None = None) -> RenderConfig:
    """Build a validated RenderConfig from a YAML preset (or dict, or config) and overrides.

    Args:
        source: path of a YAML preset, a dict, an existing RenderConfig, or None (schema defaults).
        overrides: OmegaConf dotlist (["sampling.steps=20", "prompt=a fox"]) or a dict (nested or
            with dotted keys).
    Returns:
        RenderConfig with every check passed.
    Raises:
        ConfigError listing every problem.
    """
    label = None
    try:
        if source is None:
            base = OmegaConf.create()
        elif isinstance(source, (RenderConfig, dict)):     # values, not YAML: nothing in them is a reference
            base = OmegaConf.create(shelve(source))
        elif isinstance(source, (str, os.PathLike)):
            label = str(source)
            base = _read_yaml(Path(source).expanduser())
        else:
            raise ConfigError(f"config: expected a YAML file path, a dict or a RenderConfig, got {type(source).__name__}")
        merged = OmegaConf.merge(base, overrides_conf(overrides))
    except OmegaConfBaseException as e:    # e.g. a value of a type no config can hold
        raise ConfigError(str(e).strip().splitlines()[0], label) from None
    plain = resolve(merged, label)

    if not isinstance(plain, dict):
        raise ConfigError("expected a mapping of keys", label)
    problems: list[str] = []
    check_tree(RenderConfig, plain, "", problems)
    try:
        structured = OmegaConf.merge(_blank(RenderConfig), shelve(plain))   # text stays text (shelve)
        missing = sorted(OmegaConf.missing_keys(structured))
        for key in missing:  # fill in so the other checks still run
            OmegaConf.update(structured, key, "x")
        cfg: RenderConfig = unshelve(OmegaConf.to_object(structured))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "config"
        raise ConfigError(f"{key}: {str(e).strip().splitlines()[0]}", label) from None
    problems += [f"{k}: is required and not set" for k in missing]
    problems += [p for p in cfg.problems()
                 if not any(p.startswith(k + ":") for k in missing)]
    if problems:
        raise ConfigError(problems, label)
    return canonical(cfg)


def to_yaml(cfg: RenderConfig) -> str:
    """`cfg` as a YAML preset that loads back to the same config: text holding `${` is escaped, so a
    saved `vidgen config show` never turns a prompt's text into a reference."""
    return yaml.safe_dump(_yaml_text(to_dict(cfg)), sort_keys=False, allow_unicode=True, width=10**9)


def _yaml_text(tree: Any) -> Any:
    """Strings as OmegaConf's YAML reads them back to themselves: each `${` after n backslashes becomes
    2n+1 backslashes and `${` (OmegaConf's escape, which also halves the backslashes before it)."""
    if isinstance(tree, str):
        return re.sub(r"(\\*)\$\{", lambda m: "\\" * (2 * len(m.group(1)) + 1) + "${", tree)
    if isinstance(tree, dict):
        return {k: _yaml_text(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_yaml_text(v) for v in tree]
    return tree
