"""Content credentials: a signed C2PA manifest in each output, and `vidgen verify` to check one.

Why: whoever receives a vidgen video should be able to tell by machine that a trained model made it
(EU AI Act Article 50), and with what. The manifest's c2pa.actions assertion says c2pa.created with
IPTC digital source type trainedAlgorithmicMedia; the `org.vidgen.render` assertion holds the
caller's claims (version, model and LoRA SHA-256s, config digest, seed, guard verdict); the
signature binds both to the file's bytes, so a file whose pixels changed after signing fails.

Containers (c2pa-python 0.38.1 / c2pa-rs 0.91.3, each tried in tests/test_provenance.py): .mp4,
.m4v, .mov, .gif and single images embed the manifest; .mkv, .webm and .mxf, which c2pa-rs cannot
parse, are signed whole into a NAME.c2pa sidecar (a c2pa.hash.data binding: any changed byte
fails); a folder of frames is refused (no one file to bind; a manifest a frame would let frames be
dropped or reordered unnoticed). docs/provenance.md has the rest: keys, trust, the watermark.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from PIL import Image

from . import __version__
from .errors import ConfigError, InputError, MissingExtra, OutputError, VidgenError, install_hint
from .paths import discard, partial_path
from .records import path_problem

log = logging.getLogger("vidgen")

RENDER_LABEL = "org.vidgen.render"
"""The custom assertion holding the caller's claims (vidgen version, model hashes, seed, ...)."""
TRAINED = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pth")
EMBEDDED = {".mp4": "video/mp4", ".m4v": "video/mp4", ".mov": "video/quicktime", ".gif": "image/gif",
            ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp",
            ".tif": "image/tiff", ".tiff": "image/tiff"}
"""Extensions c2pa-rs embeds a manifest in -> the MIME type it is signed as."""
SIDECAR = {".mkv": "video/x-matroska", ".webm": "video/webm", ".mxf": "application/mxf"}
"""Extensions signed whole into a NAME.c2pa sidecar manifest (c2pa-rs cannot parse them)."""
_EKUS = ("1.3.6.1.5.5.7.3.4", "1.3.6.1.5.5.7.3.36", "1.3.6.1.4.1.62558.2.1", "1.3.6.1.4.1.311.76.59.1.9")
"""Extended key usages a signing certificate may carry: emailProtection, documentSigning,
c2pa-kp-claimSigning, Microsoft's C2PA signing. c2pa-rs's default list lacks the last three (a
certificate with only documentSigning fails), so vidgen hands it this one, to sign and to verify."""
_MAX_PEM = 1 << 20
_FAILED_HASH = "the file's content was changed after signing: its data hash does not match its manifest"
_EXPLAIN = {
    "assertion.bmffHash.mismatch": "the video's data hash does not match its manifest: the pixels (or sound) "
                                   "were changed after signing",
    **dict.fromkeys(("assertion.dataHash.mismatch", "assertion.boxesHash.mismatch"), _FAILED_HASH),
    "claimSignature.mismatch": "the manifest's signature does not match it: the manifest was altered after signing",
    "assertion.hashedURI.mismatch": "an assertion of the manifest was altered after signing",
    "signingCredential.expired": "the signing certificate has expired (no time-stamp shows it was valid then)",
    "signingCredential.revoked": "the signing certificate was revoked"}


def _c2pa():
    try:
        import c2pa
    except ImportError as e:
        raise MissingExtra(f"provenance needs the c2pa-python package: {install_hint('provenance')}") from e
    return c2pa


# ---------------------------------------------------------------------------------- file hashes


def _cache_file() -> Path:
    root = os.environ.get("VIDGEN_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "vidgen") / "sha256.json"


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and all(isinstance(v, dict) for v in data.values()):
            return data
        why = "not a JSON object of entries"
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        why = f"{type(e).__name__}: {e}"
    _warn_once(f"ignoring the hash cache {path} ({why}); files are hashed again")
    return {}


def _write_cache(path: Path, entries: dict) -> None:
    """Replace the cache atomically (a reader never sees half of it); entries of files that are gone
    are dropped. A cache that cannot be written costs a re-hash next time, nothing else."""
    entries = {k: v for k, v in entries.items() if os.path.exists(k)}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = partial_path(path)
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            discard(tmp)
        _warn_once(f"cannot write the hash cache {path} ({e.strerror or e}); files will be hashed again")


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file, hashed once per (real path, size, mtime_ns): the cache in
    $VIDGEN_CACHE/sha256.json (default ~/.cache/vidgen) spares re-reading a 28 GB model each render.
    A file rewritten in place with its size and mtime kept would keep its old hash: weights files
    are replaced, not patched. InputError when the file cannot be read."""
    from .lora import sha256_of

    path = Path(path)
    if why := path_problem(path, "file"):
        raise InputError(f"{path} {why}")
    real = path.resolve()
    st = real.stat()
    key, cache_file = str(real), _cache_file()
    hit = _read_cache(cache_file).get(key, {})
    if hit.get("size") == st.st_size and hit.get("mtime_ns") == st.st_mtime_ns and isinstance(hit.get("sha256"), str):
        return hit["sha256"]
    if st.st_size > 1 << 30:
        log.info("hashing %s (%.1f GiB) for the provenance manifest; cached for next time", path, st.st_size / 2**30)
    try:
        digest = sha256_of(real)
    except OSError as e:
        raise InputError(f"{path} cannot be read ({e.strerror or e})") from e
    after = real.stat()
    if (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns):    # not written to while hashed
        entries = _read_cache(cache_file)           # read again: another process may have added some
        entries[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
        _write_cache(cache_file, entries)
    return digest


def model_digests(path: str | os.PathLike) -> dict[str, str]:
    """{name: sha256} of a model's weights: a single file -> {its name: hash}; a folder -> each
    *.safetensors/*.gguf/*.bin/*.pth file under it (hidden folders such as .cache skipped), by its
    path relative to the folder, sorted. InputError when it is missing or holds no weights."""
    path = Path(path)
    if why := path_problem(path, "file or folder"):
        raise InputError(f"{path} {why}")
    if path.is_file():
        return {path.name: file_sha256(path)}
    files = []
    for folder, dirs, names in os.walk(path, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files += [Path(folder, n) for n in names if n.endswith(WEIGHT_SUFFIXES)]
    if not files:
        raise InputError(f"{path} holds no weights files ({', '.join(WEIGHT_SUFFIXES)}) to hash")
    return {f.relative_to(path).as_posix(): file_sha256(f) for f in sorted(files)}


# ---------------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class _Credentials:
    alg: str            # c2pa's name: es256, es384, es512, ps256, ed25519
    cert: bytes         # the PEM chain, the signer's first
    key: bytes          # the key as unencrypted PKCS#8 PEM, which c2pa-rs needs (a SEC1 or PKCS#1 file works too)


def _read_pem(path, what: str, problems: list[str]) -> bytes | None:
    try:
        if (why := path_problem(path, "file")) is None and (size := os.path.getsize(path)) > _MAX_PEM:
            why = f"is {size:,} bytes; a PEM {what} is a few KiB"
        if why is None:
            return Path(path).read_bytes()
    except OSError as e:
        why = f"cannot be read ({e.strerror or e})"
    problems.append(f"provenance.{what}: {path} {why}")
    return None


def _algorithm(key) -> tuple[str | None, str | None]:
    """(c2pa's algorithm for this private key, None) or (None, why c2pa cannot sign with it)."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    allowed = "c2pa signs with EC P-256/P-384/P-521 (ES256/384/512), RSA of 2048 bits or more (PS256) or Ed25519"
    if isinstance(key, ec.EllipticCurvePrivateKey):
        alg = {"secp256r1": "es256", "secp384r1": "es384", "secp521r1": "es512"}.get(key.curve.name)
        return (alg, None) if alg else (None, f"is an EC key on curve {key.curve.name}; {allowed}")
    if isinstance(key, rsa.RSAPrivateKey):
        return ("ps256", None) if key.key_size >= 2048 else (None, f"is a {key.key_size}-bit RSA key; {allowed}")
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "ed25519", None
    return None, f"is a {type(key).__name__.removeprefix('_')} key; {allowed}"


def _leaf_problems(leaf, cert) -> list[str]:
    """What c2pa-rs's signing-certificate profile refuses in the signer's certificate, found by trying
    each case (its own message is only "the certificate is invalid"). A self-signed signer is
    accepted when it has these; it verifies as valid, its signer unknown until trusted."""
    from cryptography import x509

    out, now = [], datetime.now(timezone.utc)
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
        out.append(f"provenance.cert: {cert} is valid from {leaf.not_valid_before_utc:%Y-%m-%d} to "
                   f"{leaf.not_valid_after_utc:%Y-%m-%d}, not now")

    def ext(kind):
        try:
            return leaf.extensions.get_extension_for_class(kind).value
        except x509.ExtensionNotFound:
            return None

    basic = ext(x509.BasicConstraints)
    if basic is not None and basic.ca:
        out.append(f"provenance.cert: {cert} starts with a CA certificate; c2pa signs with an end-entity "
                   "certificate (basicConstraints CA:FALSE): put the signer's first")
    usage = ext(x509.KeyUsage)
    if usage is None or not usage.digital_signature:
        out.append(f"provenance.cert: {cert} lacks the digitalSignature key usage c2pa requires")
    ekus = {o.dotted_string for o in ext(x509.ExtendedKeyUsage) or ()}
    if not ekus & set(_EKUS):
        out.append(f"provenance.cert: {cert} has no extended key usage c2pa accepts for signing; give it "
                   "emailProtection, documentSigning or c2pa-kp-claimSigning (1.3.6.1.4.1.62558.2.1)")
    if ext(x509.AuthorityKeyIdentifier) is None:
        out.append(f"provenance.cert: {cert} has no authorityKeyIdentifier extension, which c2pa requires (of a "
                   "self-signed certificate too)")
    return out


def _load(key, cert, problems: list[str]) -> _Credentials | None:
    try:
        from cryptography import x509
        from cryptography.exceptions import UnsupportedAlgorithm
        from cryptography.hazmat.primitives import serialization
    except ImportError as e:
        raise MissingExtra(f"provenance needs the cryptography package: {install_hint('provenance')}") from e
    key_data, cert_data = _read_pem(key, "key", problems), _read_pem(cert, "cert", problems)
    private = chain = None
    if key_data is not None:
        try:
            private = serialization.load_pem_private_key(key_data, password=None)
        except TypeError:
            problems.append(f"provenance.key: {key} is encrypted; c2pa needs an unencrypted key (openssl pkcs8 "
                            "-topk8 -nocrypt -in KEY -out key.pem; keep it readable by you only)")
        except (ValueError, UnsupportedAlgorithm):
            what = "a certificate, not a private key" if b"CERTIFICATE-----" in key_data else \
                "no PEM private key (-----BEGIN PRIVATE KEY-----)"
            problems.append(f"provenance.key: {key} holds {what}")
    if cert_data is not None:
        try:
            chain = x509.load_pem_x509_certificates(cert_data)
        except ValueError:
            what = ("a private key, not a certificate" if b"PRIVATE KEY-----" in cert_data else
                    "no PEM certificate (-----BEGIN CERTIFICATE-----; DER: openssl x509 -inform der ...)")
            problems.append(f"provenance.cert: {cert} holds {what}")
    if private is None or chain is None:
        return None
    alg, why = _algorithm(private)
    if why:
        problems.append(f"provenance.key: {key} {why}")
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(*spki) != chain[0].public_key().public_bytes(*spki):
        problems.append(f"provenance.key: {key} does not match the first certificate in {cert} (the signer's "
                        "certificate must come first, then its issuers)")
    else:
        problems += _leaf_problems(chain[0], cert)
    if problems:
        return None
    pkcs8 = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    return _Credentials(alg, b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain), pkcs8)


def _context(c2pa, anchors: str | None = None):
    """c2pa settings for signing and reading: our EKU list, trust anchors when given, no network."""
    settings = {"trust": {"trust_config": "\n".join(_EKUS) + "\n"},
                "verify": {"verify_trust": True, "ocsp_fetch": False, "remote_manifest_fetch": False}}
    if anchors:
        settings["trust"]["trust_anchors"] = anchors
    return c2pa.Context.from_dict(settings)


def _signer(c2pa, creds: _Credentials):
    return c2pa.Signer.from_info(c2pa.C2paSignerInfo(creds.alg, creds.cert, creds.key, None))


def _c2pa_text(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def check_credentials(key: str | os.PathLike, cert: str | os.PathLike) -> list[str]:
    """Every problem with the configured signing key and certificate chain (missing, unreadable, not
    PEM, a key that does not match the certificate, an algorithm or certificate c2pa refuses), one
    sentence each; [] if a manifest can be signed with them. Ends with a trial signature of a tiny
    in-memory image (about 50 ms), so what c2pa-rs refuses is found before sampling, not after."""
    c2pa, problems = _c2pa(), []
    creds = _load(key, cert, problems)
    if creds is None:
        return problems
    image = io.BytesIO()
    Image.new("RGB", (8, 8)).save(image, "PNG")
    image.seek(0)
    try:
        with c2pa.Builder(_manifest({}, "check.png"), context=_context(c2pa)) as builder, \
                _signer(c2pa, creds) as signer:
            builder.sign(signer, "image/png", image, io.BytesIO())
    except c2pa.C2paError as e:
        problems.append(f"provenance.cert: c2pa refuses to sign with {cert} and {key}: {_c2pa_text(e)}")
    return problems


# ---------------------------------------------------------------------------------- signing


def _extension(path_or_ext: str | os.PathLike) -> str:
    text = os.fspath(path_or_ext)
    if isinstance(path_or_ext, str) and text.startswith(".") and os.sep not in text:
        return text.lower()
    return "" if text.endswith(("/", os.sep)) or os.path.isdir(text) else Path(text).suffix.lower()


def supports(path_or_ext: str | os.PathLike) -> str | None:
    """None if vidgen can sign this output (an output path, or an extension such as ".mp4"), else
    the reason as a clause. .mkv/.webm/.mxf are signed too, into a sidecar (c2pa_sidecar)."""
    ext = _extension(path_or_ext)
    if ext in EMBEDDED or ext in SIDECAR:
        return None
    known = ", ".join([*EMBEDDED, *SIDECAR])
    if ext == "":
        return ("a folder of frames cannot carry a C2PA manifest (there is no one file to bind it to); write a "
                "video (.mp4, .mov, .mkv, .webm, .mxf, .gif) or turn provenance off")
    return f"C2PA signing does not support {ext} files; it signs {known}"


def c2pa_sidecar(path: str | os.PathLike) -> Path | None:
    """Where a file's detached manifest goes (clip.mkv -> clip.c2pa, the C2PA spec's sidecar name) when
    its format cannot embed one (SIDECAR); None when the manifest is embedded."""
    path = Path(path)
    return path.with_suffix(".c2pa") if _extension(path) in SIDECAR else None


def _manifest(claims: dict, title: str, ingredients: int = 0) -> dict:
    version = str(claims.get("vidgen") or __version__)
    agent = {"name": "vidgen", "version": version}
    actions = [{"action": "c2pa.created", "digitalSourceType": TRAINED, "softwareAgent": agent}]
    if ingredients:
        actions.append({"action": "c2pa.placed", "softwareAgent": agent,
                        "parameters": {"ingredientIds": [f"shot-{i}" for i in range(ingredients)]}})
    assertions = [{"label": "c2pa.actions", "data": {"actions": actions}}]
    if claims:
        assertions.append({"label": RENDER_LABEL, "data": claims})
    return {"claim_generator_info": [agent], "title": title, "assertions": assertions}


def _mime(path: Path) -> str:
    ext = path.suffix.lower()
    return EMBEDDED.get(ext) or SIDECAR.get(ext) or "application/octet-stream"


def sign(src: Path, dest: Path, *, key: str | os.PathLike, cert: str | os.PathLike, claims: dict,
         ingredients: Sequence[Path] = (), title: str | None = None) -> bytes | None:
    """Write a signed copy of the finished media file `src` to `dest`.

    Args:
        src: the finished output (.mp4, .mov, .gif, ...; supports() says which).
        dest: a fresh temporary path, which the caller renames into place; removed on failure.
        key, cert: PEM files: the private key, and the signer's certificate followed by its issuers.
        claims: JSON-able facts about the render, stored as the org.vidgen.render assertion:
            {"vidgen", "model": {file: sha256}, "loras": [{path, sha256, strength}], "config_digest",
            "seed", "guard", "variant", "prompt"?, "watermark": watermark.CLAIM when the frames carry it}.
        ingredients: source files (the shots of a stitched film), added as componentOf ingredients
            with their own manifests when they have one.
        title: the manifest's title (default: src's name; dest's is a temporary's).
    Returns:
        None when the manifest is embedded; for .mkv/.webm/.mxf the sidecar manifest's bytes, which
        the caller writes to c2pa_sidecar(final path) (dest then holds an unchanged copy of src).
    Raises:
        OutputError (unsupported type, c2pa failure), ConfigError (key/cert), InputError (an ingredient).
    """
    src, dest = Path(src), Path(dest)
    if why := supports(src):
        raise OutputError(f"cannot sign {src.name}: {why}")
    c2pa, problems = _c2pa(), []
    creds = _load(key, cert, problems)
    if creds is None:
        raise ConfigError(problems)
    json.dumps(claims, allow_nan=False)          # TypeError/ValueError here, not deep inside c2pa
    mime, sidecar = _mime(src), _extension(src) in SIDECAR
    try:
        with c2pa.Builder(_manifest(claims, title or src.name, len(ingredients)),
                          context=_context(c2pa)) as builder, _signer(c2pa, creds) as signer:
            if sidecar:
                builder.set_no_embed()
            for i, shot in enumerate(map(Path, ingredients)):
                _add_ingredient(c2pa, builder, shot, i)
            with open(src, "rb") as source, open(dest, "w+b") as out:
                data = builder.sign(signer, mime, source, out)
                out.flush()
                os.fsync(out.fileno())
    except BaseException as e:
        discard(dest)
        if isinstance(e, (c2pa.C2paError, OSError)):
            why = f"{e.strerror or e} ({e.filename})" if isinstance(e, OSError) else _c2pa_text(e)
            raise OutputError(f"cannot sign {src.name}: {why}") from e
        raise
    return data if sidecar else None


def _add_ingredient(c2pa, builder, shot: Path, i: int) -> None:
    if why := path_problem(shot, "file"):
        raise InputError(f"ingredient {shot} {why}")
    try:
        with open(shot, "rb") as f:
            builder.add_ingredient({"title": shot.name, "relationship": "componentOf", "label": f"shot-{i}"},
                                   _mime(shot), f)
    except c2pa.C2paError as e:
        raise InputError(f"ingredient {shot}: c2pa cannot read it: {_c2pa_text(e)}") from e


# ---------------------------------------------------------------------------------- verifying


@dataclass
class VerifyReport:
    """What `verify` found. `ok`: the manifest is valid, the content unchanged since signing, the
    signer trusted when trust was given, and the watermark there when the manifest declares one."""

    path: str
    ok: bool = False
    manifest: str = "none"              # valid | invalid | none
    lines: list[str] = field(default_factory=list)      # what generated the file, one fact a line
    problems: list[str] = field(default_factory=list)   # why it fails, one sentence each
    watermark: str = "not checked"      # found | not found | not checked
    signer: str | None = None
    trusted: bool | None = None         # None: no trust list given
    claims: dict | None = None          # the org.vidgen.render assertion

    def to_dict(self) -> dict:
        return asdict(self)


def _anchors(trust: Sequence[str | os.PathLike]) -> str | None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    pems = []
    for path in trust:
        if why := path_problem(path, "file"):
            raise InputError(f"--trust {path} {why}")
        try:
            certs = x509.load_pem_x509_certificates(Path(path).read_bytes()[:_MAX_PEM])
        except OSError as e:
            raise InputError(f"--trust {path} cannot be read ({e.strerror or e})") from e
        except ValueError as e:
            raise InputError(f"--trust {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)") from e
        pems += [c.public_bytes(serialization.Encoding.PEM).decode() for c in certs]
    return "".join(pems) or None


def _explain(item: dict) -> str:
    return _EXPLAIN.get(item["code"]) or f"{item['code']}: {item.get('explanation') or 'failed'}"


def _failures(results: dict) -> list[dict]:
    """The manifest's failed checks, and those of its ingredients' manifests (a shot's counts too)."""
    out = list((results.get("activeManifest") or {}).get("failure") or [])
    for delta in results.get("ingredientDeltas") or []:
        out += (delta.get("validationDeltas") or {}).get("failure") or []
    return [{"code": "", **f} for f in out]


def _assertion(manifest: dict, *labels: str):
    return next((a.get("data") for a in manifest.get("assertions") or [] if a.get("label") in labels), None)


def _describe(report: VerifyReport, reader, manifest: dict) -> None:
    """The report's lines: who and what made the file, from its active manifest."""
    gen = (manifest.get("claim_generator_info") or [{}])[0]
    report.lines.append(f"generator: {gen.get('name', '?')} {gen.get('version', '')}".rstrip())
    actions = _assertion(manifest, "c2pa.actions", "c2pa.actions.v2") or {}
    sources = {a.get("digitalSourceType", "").rsplit("/", 1)[-1] for a in actions.get("actions") or []} - {""}
    if sources:
        ai = " (made by a trained model)" if "trainedAlgorithmicMedia" in sources else ""
        report.lines.append(f"digital source type: {', '.join(sorted(sources))}{ai}")
    claims = _assertion(manifest, RENDER_LABEL)
    report.claims = claims if isinstance(claims, dict) else None
    report.lines += _claim_lines(report.claims or {})
    for ing in manifest.get("ingredients") or []:
        label = ing.get("active_manifest")
        facts = (_assertion(reader.get_manifest(label) or {}, RENDER_LABEL) or {}) if label else {}
        what = ", ".join(f"{k} {facts[k]}" for k in ("vidgen", "seed") if k in facts)
        what = what or ("a manifest" if label else "no manifest of its own")
        report.lines.append(f"ingredient: {ing.get('title', '?')} ({ing.get('relationship', '?')}; {what})")


def _claim_lines(claims: dict) -> list[str]:
    model = claims.get("model") if isinstance(claims.get("model"), dict) else {}     # "vidgen": the generator line
    out = [f"model: {name} sha256 {digest}" for name, digest in model.items()]
    out += [f"lora: {lora.get('path')} sha256 {lora.get('sha256')} strength {lora.get('strength')}"
            for lora in claims.get("loras") or [] if isinstance(lora, dict)]
    for key in ("seed", "config_digest", "variant", "guard", "prompt"):
        if key in claims:
            value = claims[key]
            shown = json.dumps(value) if isinstance(value, (dict, list, type(None))) else value
            out.append(f"{key.replace('_', ' ')}: {shown}")
    return out


def _check_watermark(report: VerifyReport, path: Path, declared: bool) -> None:
    from .watermark import THRESHOLD, detect_file

    try:
        result = detect_file(path)
    except (VidgenError, ValueError) as e:
        report.lines.append(f"watermark: not checked: {e}")
        return
    report.watermark = "found" if result.found else "not found"
    report.lines.append(f"watermark: {result.summary()}")
    if declared and not result.found:
        report.problems.append(f"the invisible watermark its manifest declares is not in the frames (score "
                               f"{result.score:.2f}, {THRESHOLD} needed): they were replaced or re-made")


def verify(path: str | os.PathLike, *, trust: Sequence[str | os.PathLike] = ()) -> VerifyReport:
    """Read and check a file's C2PA manifest (embedded, or the NAME.c2pa sidecar of an .mkv/.webm/.mxf),
    and the invisible watermark when the manifest declares one or there is no manifest.

    Args:
        path: the media file.
        trust: PEM files of the CA certificates whose signers you accept; empty: the signer is shown, not judged.
    Returns:
        VerifyReport: `problems` says why it fails, `lines` what generated the file. InputError when the
        file or a trust certificate is missing or unreadable.
    """
    path = Path(path)
    if why := path_problem(path, "file"):
        raise InputError(f"{path} {why}; give one media file (.mp4, .mov, .gif, .mkv, ...)")
    c2pa = _c2pa()
    anchors = _anchors(trust)
    report = VerifyReport(path=str(path))
    sidecar = c2pa_sidecar(path)
    lost = sidecar is not None and not sidecar.is_file()
    try:
        with open(path, "rb") as media:
            data = None if sidecar is None or lost else sidecar.read_bytes()
            reader = None if lost else c2pa.Reader.try_create(_mime(path), media, data, context=_context(c2pa, anchors))
            if lost:
                report.problems.append(f"it has no C2PA manifest: {path.suffix} files carry theirs in a sidecar, "
                                       f"and {sidecar.name} is not beside it")
            elif reader is None:
                report.problems.append("it has no C2PA manifest")
            else:
                with reader:
                    _judge(report, reader, anchors is not None)
    except c2pa.C2paError as e:
        report.manifest = "invalid"
        report.problems.append(f"its C2PA manifest cannot be read: {_c2pa_text(e)}")
    except OSError as e:
        raise InputError(f"{path} cannot be read ({e.strerror or e})") from e
    declared = bool(report.claims and report.claims.get("watermark"))
    if declared or report.manifest == "none":
        _check_watermark(report, path, declared)
        if report.manifest == "none" and report.watermark == "found":
            report.problems[0] += ("; the vidgen watermark is in its frames: vidgen made it, and its manifest "
                                   "was removed (a re-encode, an upload)")
    else:
        report.lines.append("watermark: not checked (the manifest does not declare one)")
    report.ok = report.manifest == "valid" and not report.problems
    return report


def _judge(report: VerifyReport, reader, trusting: bool) -> None:
    """The manifest's verdict: valid or invalid, the signer, and the lines describing the file."""
    results = reader.get_validation_results() or {}
    failures = _failures(results)
    untrusted = any(f["code"] == "signingCredential.untrusted" for f in failures)
    problems = list(dict.fromkeys(_explain(f) for f in failures if f["code"] != "signingCredential.untrusted"))
    report.manifest = "invalid" if problems else "valid"
    report.problems += problems
    manifest = reader.get_active_manifest() or {}
    info = manifest.get("signature_info") or {}
    report.signer = info.get("common_name") or info.get("issuer") or "unknown"
    # c2pa's "issuer" is the signer's organisation (its subject's O), not who issued its certificate
    org = f" ({info['issuer']})" if info.get("issuer") and info.get("common_name") else ""
    if trusting:
        report.trusted = not untrusted
        judged = "trusted (issued under a --trust certificate)" if not untrusted else "NOT trusted"
        if untrusted:
            report.problems.append(f"the signer {report.signer!r} is not issued by any --trust certificate")
    else:
        judged = "not judged (no --trust CERT given)"
    report.lines.insert(0, f"manifest: {report.manifest}; signed by {report.signer}{org}, "
                           f"{str(info.get('alg', '?')).upper()}, {judged}")
    _describe(report, reader, manifest)
