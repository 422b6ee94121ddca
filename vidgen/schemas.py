"""The counts and sizes in a model folder's JSON, checked for range before anything is built from them.

A model's config.json files decide how large a model vidgen builds (on the meta device to check
shapes and plan memory, then for real): `num_layers: 1000000` would build a million blocks before
anything else is said, `attention_head_dim: 0` divides by zero inside diffusers. One validator per
component schema — transformer (both experts), VAE, text encoder, image encoder, scheduler — checks
every count and size against a range, and the few sizes that must agree with each other; every
problem of every file is reported at once, each naming its file and key.

The upper bounds are far above any published Wan model (Wan2.1/2.2 14B: 40 blocks of 40 heads x
128, feed-forward 13824; UMT5-XXL: 24 layers, width 4096, 256384 tokens; the 5B VAE: base width
160, 48 latent channels) and low enough that no value in range makes building the meta model or
planning its memory take more than moments.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .errors import ModelLoadError
from .records import bool_field, describe, float_field, int_field, int_tuple_field, is_int, read_json_object

FILES = {"transformer": "transformer/config.json", "transformer_2": "transformer_2/config.json",
         "vae": "vae/config.json", "text_encoder": "text_encoder/config.json",
         "image_encoder": "image_encoder/config.json", "scheduler": "scheduler/scheduler_config.json"}
"""Each component's JSON file in a diffusers folder."""

MAX_WIDTH = 65_536
"""The widest attention or hidden size accepted (heads x head size): Wan 14B's is 5120."""


def _ints(conf: dict, where: str, problems: list[str], ranges: dict[str, tuple[Any, int, int]]) -> dict[str, Any]:
    """{key: conf[key] in range, or its default}; each value out of range is a problem."""
    return {key: int_field(conf, key, default, lo, hi, where, problems) for key, (default, lo, hi) in ranges.items()}


def _product(problems: list[str], where: str, what: str, values: dict, keys: tuple[str, ...], most: int) -> None:
    if all(is_int(values[k]) for k in keys) and math.prod(values[k] for k in keys) > most:
        problems.append(f"{where}: {' x '.join(keys)} is {math.prod(values[k] for k in keys)} (expected {what} "
                        f"of at most {most})")


def transformer(conf: dict, where: str, problems: list[str]) -> dict[str, Any]:
    """WanTransformer3DModel's counts and sizes (diffusers' defaults for what is absent)."""
    v = _ints(conf, where, problems, {
        "num_layers": (40, 1, 256), "num_attention_heads": (40, 1, 512), "attention_head_dim": (128, 2, 4096),
        "in_channels": (16, 1, 4096), "out_channels": (None, 1, 4096), "text_dim": (4096, 1, MAX_WIDTH),
        "freq_dim": (256, 1, MAX_WIDTH), "ffn_dim": (13824, 1, 4 * MAX_WIDTH), "rope_max_seq_len": (1024, 1, 2**20),
        "image_dim": (None, 1, MAX_WIDTH), "added_kv_proj_dim": (None, 1, MAX_WIDTH),
        "pos_embed_seq_len": (None, 1, 2**16)})
    v["patch_size"] = int_tuple_field(conf, "patch_size", (1, 2, 2), 3, 1, 16, where, problems)
    if is_int(v["attention_head_dim"]) and v["attention_head_dim"] % 2:
        # the rotary embedding splits each head into (frames, height, width) halves of even size
        problems.append(f"{where}: attention_head_dim is {v['attention_head_dim']} (expected an even integer)")
    _product(problems, where, "a width", v, ("num_attention_heads", "attention_head_dim"), MAX_WIDTH)
    if "vace_layers" in conf:           # WanVACETransformer3DModel: context blocks after these blocks
        v |= _ints(conf, where, problems, {"vace_in_channels": (96, 1, 4096)})
        layers = conf["vace_layers"]
        if not (isinstance(layers, list) and layers and all(is_int(i) for i in layers)
                and 0 in layers and len(set(layers)) == len(layers)
                and (not is_int(v["num_layers"]) or max(layers) < v["num_layers"])):
            problems.append(f"{where}: vace_layers is {describe(layers)} (expected distinct block indices below "
                            "num_layers, 0 among them)")
            layers = [0]
        v["vace_layers"] = tuple(layers)
    return v


def vae(conf: dict, where: str, problems: list[str]) -> dict[str, Any]:
    """AutoencoderKLWan's counts and sizes, and the two compression factors its layout implies."""
    v = _ints(conf, where, problems, {
        "base_dim": (96, 1, 4096), "decoder_base_dim": (None, 1, 4096), "z_dim": (16, 1, 1024),
        "num_res_blocks": (2, 1, 16), "in_channels": (3, 1, 64), "out_channels": (3, 1, 64),
        "patch_size": (None, 1, 16), "scale_factor_spatial": (8, 1, 64), "scale_factor_temporal": (4, 1, 16)})
    mult = conf.get("dim_mult", [1, 2, 4, 4])
    if not (isinstance(mult, list) and 1 <= len(mult) <= 8 and all(is_int(m) and 1 <= m <= 64 for m in mult)):
        problems.append(f"{where}: dim_mult is {describe(mult)} (expected 1 to 8 integers, each in 1..64)")
        mult = None
    down = conf.get("temperal_downsample", [False, True, True])
    if not (isinstance(down, list) and all(isinstance(d, bool) for d in down)
            and (mult is None or len(down) == len(mult) - 1)):
        want = f"{len(mult) - 1} true/false values, one per downsampling stage" if mult else "a list of true/false"
        problems.append(f"{where}: temperal_downsample is {describe(down)} (expected {want})")
        down = None
    for key, positive in (("latents_mean", False), ("latents_std", True)):
        values = conf.get(key)
        if values is None:
            continue
        ok = isinstance(values, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                              and math.isfinite(x) and (x > 0 or not positive) for x in values)
        if not ok or (is_int(v["z_dim"]) and len(values) != v["z_dim"]):
            problems.append(f"{where}: {key} is {describe(values)} (expected {v['z_dim']} finite numbers"
                            f"{', each > 0' if positive else ''}, one per latent channel)")
    bool_field(conf, "is_residual", False, where, problems)
    if mult is not None and is_int(v["base_dim"]):
        widest = max(v["base_dim"], v["decoder_base_dim"] or 0) * max(mult)
        if widest > 16_384:
            problems.append(f"{where}: base_dim x max(dim_mult) is {widest} (expected a width of at most 16384)")
    if mult is not None and is_int(v["scale_factor_spatial"]) and (v["patch_size"] is None or is_int(v["patch_size"])):
        implied = 2 ** (len(mult) - 1) * (v["patch_size"] or 1)
        if implied != v["scale_factor_spatial"]:
            problems.append(f"{where}: scale_factor_spatial is {v['scale_factor_spatial']}, but {len(mult) - 1} "
                            f"downsampling stages x patch_size {v['patch_size'] or 1} compress {implied}x")
    if down is not None and is_int(v["scale_factor_temporal"]) and 2 ** sum(down) != v["scale_factor_temporal"]:
        problems.append(f"{where}: scale_factor_temporal is {v['scale_factor_temporal']}, but temperal_downsample "
                        f"compresses {2 ** sum(down)}x")
    return v


def text_encoder(conf: dict, where: str, problems: list[str]) -> dict[str, Any]:
    """transformers' UMT5/T5 encoder counts and sizes (UMT5Config's defaults for what is absent)."""
    v = _ints(conf, where, problems, {
        "vocab_size": (250112, 1, 2**21), "d_model": (512, 1, MAX_WIDTH), "d_kv": (64, 1, 4096),
        "d_ff": (1024, 1, 4 * MAX_WIDTH), "num_layers": (8, 1, 256), "num_decoder_layers": (None, 0, 256),
        "num_heads": (6, 1, 512), "relative_attention_num_buckets": (32, 1, 4096),
        "relative_attention_max_distance": (128, 1, 2**20)})
    _product(problems, where, "a width", v, ("num_heads", "d_kv"), MAX_WIDTH)
    return v


def image_encoder(conf: dict, where: str, problems: list[str]) -> dict[str, Any]:
    """transformers' CLIP vision model counts and sizes (Wan2.1 I2V's image encoder)."""
    v = _ints(conf, where, problems, {
        "hidden_size": (768, 1, MAX_WIDTH), "intermediate_size": (3072, 1, 4 * MAX_WIDTH),
        "num_hidden_layers": (12, 1, 256), "num_attention_heads": (12, 1, 512), "image_size": (224, 1, 8192),
        "patch_size": (32, 1, 8192), "num_channels": (3, 1, 64), "projection_dim": (512, 1, MAX_WIDTH)})
    h, n = v["hidden_size"], v["num_attention_heads"]
    if is_int(h) and is_int(n) and h % n:
        problems.append(f"{where}: hidden_size {h} is not a multiple of num_attention_heads {n}")
    if is_int(v["image_size"]) and is_int(v["patch_size"]) and v["patch_size"] > v["image_size"]:
        problems.append(f"{where}: patch_size {v['patch_size']} is larger than image_size {v['image_size']}")
    return v


def scheduler(conf: dict, where: str, problems: list[str]) -> dict[str, Any]:
    """The flow-matching scheduler's counts and its shift."""
    v = _ints(conf, where, problems, {"num_train_timesteps": (1000, 1, 100_000), "solver_order": (2, 1, 3)})
    for key in ("flow_shift", "shift"):
        v[key] = float_field(conf, key, 1.0, where, problems, above=0.0)
    return v


VALIDATORS = {"transformer": transformer, "transformer_2": transformer, "vae": vae, "text_encoder": text_encoder,
              "image_encoder": image_encoder, "scheduler": scheduler}


def check(configs: dict[str, dict], problems: list[str]) -> dict[str, dict[str, Any]]:
    """{role: checked values} of each component's JSON object (role as in FILES); every problem appended."""
    return {role: VALIDATORS[role](conf, FILES[role], problems) for role, conf in configs.items()
            if role in VALIDATORS and isinstance(conf, dict)}


def read(root: Path, problems: list[str], skip: set[str] = frozenset(), reader=read_json_object) -> dict[str, dict]:
    """{role: JSON object} of each component file the folder `root` has, but those in `skip` (a file
    that cannot be read is a problem); `reader(path, what, problems)` reads one (records.read_json_object,
    or a folders.Scan's json)."""
    out = {}
    for role, rel in FILES.items():
        if role not in skip and (root / rel).is_file() and (conf := reader(root / rel, rel, problems)) is not None:
            out[role] = conf
    return out


def check_folder(root: Path, configs: dict[str, dict] | None = None, *, reader=read_json_object) -> None:
    """Raise ModelLoadError naming every count or size out of range in `root`'s component JSON
    (`configs`: objects already read, role -> object; the others are read from the folder by `reader`)."""
    problems: list[str] = []
    given = {role: conf for role, conf in (configs or {}).items() if conf is not None}
    merged = {**read(root, problems, skip=set(given), reader=reader), **given}
    check({role: merged[role] for role in FILES if role in merged}, problems)
    if problems:
        count = f" ({len(problems)} problems)" if len(problems) > 1 else ""
        raise ModelLoadError(f"model folder {root} is invalid{count}: {'; '.join(problems)}")
