"""Content credentials (vidgen.provenance) and the invisible watermark (vidgen.watermark).

A signing pair (a test CA and an ES256 signer it issued) is made here with `cryptography` for each
test session and never written outside pytest's temporary folders. The clips are synthetic but not
flat: a gradient, smooth texture, moving shapes and noise, as a render has.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import struct
from pathlib import Path
from types import SimpleNamespace

import av
import numpy as np
import pytest
from PIL import Image

pytest.importorskip("c2pa", reason="the provenance extra (c2pa-python) is not installed")

from cryptography import x509  # noqa: E402  (after the skip: c2pa-python brings cryptography)
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

from vidgen import provenance, watermark  # noqa: E402
from vidgen.cli import main  # noqa: E402
from vidgen.errors import ConfigError, MissingExtra, OutputError, install_hint  # noqa: E402

CLAIMS = {"vidgen": "0.1.0", "model": {"transformer/diffusion_pytorch_model.safetensors": "ab" * 32},
          "loras": [{"path": "outline.safetensors", "sha256": "cd" * 32, "strength": 0.8}],
          "config_digest": "0123456789abcdef", "seed": 3, "guard": "passed", "variant": "wan2.1-t2v"}


# ---------------------------------------------------------------------------------- test signing pairs


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vidgen tests")])


def _ca(cn: str = "vidgen test CA"):
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _signer(ca_key, ca_cert, *, eku=True, aki=True, self_signed=False):
    """An end-entity certificate as c2pa-rs wants one: digitalSignature, emailProtection, an AKI."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    issuer, signing_key = (_name("vidgen test signer"), key) if self_signed else (ca_cert.subject, ca_key)
    b = (x509.CertificateBuilder().subject_name(_name("vidgen test signer")).issuer_name(issuer)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True))
    if aki:
        aki_value = x509.AuthorityKeyIdentifier.from_issuer_public_key(signing_key.public_key())
        b = b.add_extension(aki_value, critical=False)
    if eku:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]), critical=False)
    return key, b.sign(signing_key, hashes.SHA256())


def _pem(x) -> bytes:
    if isinstance(x, x509.Certificate):
        return x.public_bytes(serialization.Encoding.PEM)
    return x.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """key.pem, cert.pem (signer then CA), ca.pem, and other_ca.pem (a CA that issued nothing here)."""
    root = tmp_path_factory.mktemp("pki")
    ca_key, ca = _ca()
    key, cert = _signer(ca_key, ca)
    out = SimpleNamespace(root=root, key=root / "key.pem", cert=root / "cert.pem", ca=root / "ca.pem",
                          other_ca=root / "other_ca.pem", ca_key=ca_key, ca_cert=ca)
    out.key.write_bytes(_pem(key))
    out.cert.write_bytes(_pem(cert) + _pem(ca))
    out.ca.write_bytes(_pem(ca))
    out.other_ca.write_bytes(_pem(_ca("another CA")[1]))
    return out


# ---------------------------------------------------------------------------------- clips


def _frames(seed: int, n: int = 8, size: int = 256) -> list[np.ndarray]:
    """A natural-ish clip: a two-colour gradient, smooth texture, four moving shapes, sensor noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    c0, c1 = rng.uniform(20, 235, 3), rng.uniform(20, 235, 3)
    angle = rng.uniform(0, np.pi)
    t = ((np.cos(angle) * xx + np.sin(angle) * yy) / (size * 1.5) + 0.2)[..., None]
    texture = Image.fromarray(rng.normal(0, 1, (size // 16, size // 16)).astype(np.float32))   # mode F
    background = c0 * (1 - t) + c1 * t + 12 * np.asarray(texture.resize((size, size), Image.BICUBIC))[..., None]
    shapes = [(rng.uniform(30, size - 30, 2), rng.uniform(12, 50), rng.uniform(0, 255, 3), rng.uniform(-4, 4, 2),
               rng.integers(0, 2)) for _ in range(4)]
    out = []
    for i in range(n):
        f = background.copy()
        for (x, y), r, colour, v, disc in shapes:
            dx, dy = xx - x - v[0] * i, yy - y - v[1] * i
            f[(dx * dx + dy * dy < r * r) if disc else ((abs(dx) < r) & (abs(dy) < 0.7 * r))] = colour
        out.append(np.clip(f + rng.normal(0, 3, f.shape), 0, 255).astype(np.uint8))
    return out


def _encode(frames, target, *, crf: int = 23, fps: int = 8, fmt: str | None = None) -> None:
    """H.264 (libx264, yuv420p) into a file or a BytesIO."""
    with av.open(str(target) if isinstance(target, Path) else target, "w", format=fmt) as c:
        s = c.add_stream("libx264", rate=fps, options={"crf": str(crf)})
        s.height, s.width = frames[0].shape[:2]
        s.pix_fmt = "yuv420p"
        for f in frames:
            c.mux(s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        c.mux(s.encode())


def _decode(source) -> list[np.ndarray]:
    with av.open(str(source) if isinstance(source, Path) else source) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def _h264(frames, crf: int = 23) -> list[np.ndarray]:
    buf = io.BytesIO()
    _encode(frames, buf, crf=crf, fps=24, fmt="mp4")
    buf.seek(0)
    return _decode(buf)


@pytest.fixture(scope="module")
def signed(pair, tmp_path_factory):
    """A 64x64, 8-frame H.264 clip, signed: (unsigned path, signed path)."""
    root = tmp_path_factory.mktemp("signed")
    plain, out = root / "clip.mp4", root / "signed.mp4"
    _encode(_frames(0, 8, 64), plain)
    assert provenance.sign(plain, out, key=pair.key, cert=pair.cert, claims=CLAIMS, title="clip.mp4") is None
    return plain, out


def _boxes(data, start=0, end=None):
    """Top-level (or a box's) ISO-BMFF boxes: (type, offset, size, header size)."""
    end, at = len(data) if end is None else end, start
    while at < end:
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        head = 8
        if size == 1:
            size, head = struct.unpack(">Q", data[at + 8:at + 16])[0], 16
        elif size == 0:
            size = end - at
        yield kind.decode("latin-1"), at, size, head
        at += size


def _tamper(signed_path: Path, out: Path, frame: int = 3) -> None:
    """What an editor would do: decode the signed clip, paint over one frame, encode it again with
    the same settings, and carry the manifest over (its `uuid` box, after `ftyp`, the chunk offsets
    moved to match), so the result plays and still holds the original signed manifest."""
    frames = _decode(signed_path)
    frames[frame] = frames[frame].copy()
    frames[frame][:16, :16] = 255
    buf = io.BytesIO()
    _encode(frames, buf, fmt="mp4")
    video = bytearray(buf.getvalue())
    original = signed_path.read_bytes()
    box = next(original[o:o + s] for kind, o, s, _ in _boxes(original) if kind == "uuid")
    ftyp_end = next(o + s for kind, o, s, _ in _boxes(video) if kind == "ftyp")

    def shift(start, end):
        for kind, o, s, head in _boxes(video, start, end):
            if kind in ("moov", "trak", "mdia", "minf", "stbl"):
                shift(o + head, o + s)
            elif kind in ("stco", "co64"):
                wide = kind == "co64"
                count = struct.unpack(">I", video[o + 12:o + 16])[0]
                for i in range(count):
                    at, fmt = (o + 16 + 8 * i, ">Q") if wide else (o + 16 + 4 * i, ">I")
                    old = struct.unpack(fmt, video[at:at + struct.calcsize(fmt)])[0]
                    struct.pack_into(fmt, video, at, old + len(box))
    shift(0, len(video))
    out.write_bytes(bytes(video[:ftyp_end]) + box + bytes(video[ftyp_end:]))


# ---------------------------------------------------------------------------------- sign and verify


def test_signed_clip_verifies_and_says_what_made_it(signed):
    _, path = signed
    report = provenance.verify(path)
    assert report.ok and report.manifest == "valid" and report.problems == [], report
    text = "\n".join(report.lines)
    for needle in ("generator: vidgen 0.1.0", f"sha256 {'ab' * 32}", "seed: 3", "config digest: 0123456789abcdef",
                   "guard: passed", "trainedAlgorithmicMedia", "vidgen test signer", "not judged",
                   "lora: outline.safetensors"):
        assert needle in text, text
    assert report.claims == CLAIMS and report.trusted is None
    assert _decode(path) and len(_decode(path)) == 8             # still plays


def test_manifest_marks_the_clip_as_ai_generated(signed):
    """EU AI Act Article 50: the machine-readable mark is a c2pa.created action with IPTC's
    trainedAlgorithmicMedia digital source type."""
    import c2pa

    with c2pa.Reader(str(signed[1])) as reader:
        manifest = reader.get_active_manifest()
    actions = next(a["data"]["actions"] for a in manifest["assertions"] if a["label"].startswith("c2pa.actions"))
    assert actions[0]["action"] == "c2pa.created"
    assert actions[0]["digitalSourceType"] == provenance.TRAINED
    assert actions[0]["softwareAgent"]["name"] == "vidgen"
    assert any(a["label"] == provenance.RENDER_LABEL and a["data"]["seed"] == 3 for a in manifest["assertions"])


def test_a_changed_frame_fails_verification(signed, tmp_path):
    _, path = signed
    tampered = tmp_path / "tampered.mp4"
    _tamper(path, tampered)
    frames, before = _decode(tampered), _decode(path)
    assert len(frames) == 8 and not np.array_equal(frames[3], before[3])     # it plays, one frame changed
    report = provenance.verify(tampered)
    assert not report.ok and report.manifest == "invalid"
    assert report.problems == ["the video's data hash does not match its manifest: the pixels (or sound) were "
                               "changed after signing"]


def test_trust_list_judges_the_signer(signed, pair):
    _, path = signed
    report = provenance.verify(path, trust=[pair.ca])
    assert report.ok and report.trusted is True and "trusted" in report.lines[0]
    report = provenance.verify(path, trust=[pair.other_ca])
    assert not report.ok and report.manifest == "valid" and report.trusted is False
    assert report.problems == ["the signer 'vidgen test signer' is not issued by any --trust certificate"]


def test_no_manifest_is_not_an_invalid_one(signed):
    report = provenance.verify(signed[0])
    assert not report.ok and report.manifest == "none" and report.problems == ["it has no C2PA manifest"]
    assert "too small for the invisible watermark" in report.lines[-1]      # 64x64: looked for, cannot be there


def test_stitched_film_lists_its_shots_as_ingredients(signed, pair, tmp_path):
    plain, shot = signed
    film = tmp_path / "film.mp4"
    provenance.sign(plain, film, key=pair.key, cert=pair.cert, claims={**CLAIMS, "seed": None},
                    ingredients=[shot, plain])
    report = provenance.verify(film)
    assert report.ok, report.problems
    assert "ingredient: signed.mp4 (componentOf; vidgen 0.1.0, seed 3)" in report.lines
    assert "ingredient: clip.mp4 (componentOf; no manifest of its own)" in report.lines


def _clip(path: Path, encoder: str, pix_fmt: str, *, seed: int) -> Path:
    """Four 64x64 frames of `_frames(seed, ...)` at 8 fps through `encoder` in `pix_fmt`."""
    with av.open(str(path), "w") as c:
        s = c.add_stream(encoder, rate=8)
        s.width = s.height = 64
        s.pix_fmt = pix_fmt
        for f in _frames(seed, 4, 64):
            c.mux(s.encode(av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format=pix_fmt)))
        c.mux(s.encode())
    return path


@pytest.mark.parametrize("ext", [".mov", ".gif"])
def test_quicktime_and_gif_embed_the_manifest(pair, tmp_path, ext):
    video = _clip(tmp_path / f"clip{ext}", "gif" if ext == ".gif" else "libx264", "rgb8" if ext == ".gif" else "yuv420p",
                  seed=2)
    assert provenance.sign(video, tmp_path / f"signed{ext}", key=pair.key, cert=pair.cert, claims=CLAIMS) is None
    report = provenance.verify(tmp_path / f"signed{ext}")
    assert report.ok and "seed: 3" in report.lines, report
    assert len(_decode(tmp_path / f"signed{ext}")) == 4


@pytest.mark.parametrize("ext", [".mkv", ".webm"])
def test_matroska_is_signed_into_a_sidecar(pair, tmp_path, ext):
    video = _clip(tmp_path / f"clip{ext}", "libvpx-vp9" if ext == ".webm" else "libx264", "yuv420p", seed=1)
    out = tmp_path / f"signed{ext}"
    manifest = provenance.sign(video, out, key=pair.key, cert=pair.cert, claims=CLAIMS)
    assert out.read_bytes() == video.read_bytes() and manifest
    sidecar = provenance.c2pa_sidecar(out)
    assert sidecar == tmp_path / "signed.c2pa"
    sidecar.write_bytes(manifest)
    assert provenance.verify(out).ok
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0xFF
    out.write_bytes(bytes(data))
    report = provenance.verify(out)
    assert not report.ok and report.problems == [provenance._FAILED_HASH]
    sidecar.unlink()
    assert provenance.verify(out).problems == [f"it has no C2PA manifest: {ext} files carry theirs in a sidecar, "
                                               "and signed.c2pa is not beside it"]


def test_supported_containers():
    import c2pa

    for ext in (".mp4", ".mov", ".m4v", ".gif", ".mkv", ".webm", ".mxf", "clip.MP4"):
        assert provenance.supports(ext) is None, ext
    assert provenance.c2pa_sidecar("out/clip.mp4") is None
    assert provenance.c2pa_sidecar("out/clip.mxf") == Path("out/clip.c2pa")
    assert "a folder of frames cannot carry a C2PA manifest" in provenance.supports("out/frames")
    assert "does not support .exr" in provenance.supports(".exr")
    # what vidgen embeds in is what this c2pa build embeds in; the others it cannot parse
    supported = set(c2pa.Builder.get_supported_mime_types())
    assert {ext.lstrip(".") for ext in provenance.EMBEDDED} <= supported
    assert not {ext.lstrip(".") for ext in provenance.SIDECAR} & supported
    from vidgen.paths import C2PA_SIDECAR_TYPES          # a render claims NAME.c2pa for exactly these
    assert set(provenance.SIDECAR) == set(C2PA_SIDECAR_TYPES)


def test_sign_refuses_a_frame_folder_and_writes_nothing(pair, tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    dest = tmp_path / ".frames.partial"
    with pytest.raises(OutputError, match="a folder of frames cannot carry a C2PA manifest"):
        provenance.sign(folder, dest, key=pair.key, cert=pair.cert, claims=CLAIMS)
    assert not dest.exists()


# ---------------------------------------------------------------------------------- credentials


def test_check_credentials(pair, tmp_path):
    assert provenance.check_credentials(pair.key, pair.cert) == []
    missing = tmp_path / "nope.pem"
    assert provenance.check_credentials(missing, pair.cert) == [f"provenance.key: {missing} does not exist"]
    other = tmp_path / "other_key.pem"
    other.write_bytes(_pem(ec.generate_private_key(ec.SECP256R1())))
    [problem] = provenance.check_credentials(other, pair.cert)
    assert problem.startswith(f"provenance.key: {other} does not match the first certificate in {pair.cert}")
    swapped = provenance.check_credentials(pair.cert, pair.key)
    assert swapped == [f"provenance.key: {pair.cert} holds a certificate, not a private key",
                       f"provenance.cert: {pair.key} holds a private key, not a certificate"]
    encrypted = tmp_path / "encrypted.pem"
    key = serialization.load_pem_private_key(pair.key.read_bytes(), None)
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"secret")))
    assert "is encrypted" in provenance.check_credentials(encrypted, pair.cert)[0]
    sec1 = tmp_path / "sec1.pem"            # "BEGIN EC PRIVATE KEY": c2pa-rs takes PKCS#8 only; vidgen converts
    sec1.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    assert provenance.check_credentials(sec1, pair.cert) == []
    (tmp_path / "k1.pem").write_bytes(_pem(ec.generate_private_key(ec.SECP256K1())))   # a curve c2pa cannot sign with
    assert "curve secp256k1" in provenance.check_credentials(tmp_path / "k1.pem", pair.cert)[0]


@pytest.mark.parametrize("case, needle", [("no_aki", "no authorityKeyIdentifier"), ("no_eku", "no extended key usage")])
def test_certificates_c2pa_refuses_are_caught_before_signing(pair, tmp_path, case, needle):
    import c2pa

    key, cert = _signer(pair.ca_key, pair.ca_cert, eku=case != "no_eku", aki=case != "no_aki")
    (tmp_path / "k.pem").write_bytes(_pem(key))
    (tmp_path / "c.pem").write_bytes(_pem(cert))
    problems = provenance.check_credentials(tmp_path / "k.pem", tmp_path / "c.pem")
    assert len(problems) == 1 and needle in problems[0], problems
    with pytest.raises(c2pa.C2paError):        # what c2pa-rs says without the check
        with c2pa.Builder(provenance._manifest({}, "x.png")) as b, \
                c2pa.Signer.from_info(c2pa.C2paSignerInfo("es256", _pem(cert), _pem(key), None)) as s:
            png = io.BytesIO()
            Image.new("RGB", (8, 8)).save(png, "PNG")
            png.seek(0)
            b.sign(s, "image/png", png, io.BytesIO())
    with pytest.raises(ConfigError, match=needle):
        provenance.sign(Path("unused.mp4"), tmp_path / "out.mp4", key=tmp_path / "k.pem", cert=tmp_path / "c.pem",
                        claims=CLAIMS)


def test_a_self_signed_signer_is_valid_and_unjudged(signed, tmp_path):
    """c2pa-rs takes a self-signed end-entity certificate that has the extensions above; it verifies
    as valid, its signer unknown: not tampered."""
    key, cert = _signer(None, None, self_signed=True)
    (tmp_path / "k.pem").write_bytes(_pem(key))
    (tmp_path / "c.pem").write_bytes(_pem(cert))
    assert provenance.check_credentials(tmp_path / "k.pem", tmp_path / "c.pem") == []
    provenance.sign(signed[0], tmp_path / "s.mp4", key=tmp_path / "k.pem", cert=tmp_path / "c.pem", claims=CLAIMS)
    report = provenance.verify(tmp_path / "s.mp4")
    assert report.ok and report.trusted is None and "not judged" in report.lines[0]
    report = provenance.verify(tmp_path / "s.mp4", trust=[tmp_path / "c.pem"])
    assert report.ok and report.trusted is True          # its own certificate as the trust anchor


def test_missing_c2pa_says_how_to_install_the_extra(monkeypatch, pair):
    import builtins

    real = builtins.__import__

    def without_c2pa(name, *a, **k):
        if name.split(".")[0] == "c2pa":
            raise ImportError("No module named 'c2pa'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", without_c2pa)
    with pytest.raises(MissingExtra) as e:
        provenance.check_credentials(pair.key, pair.cert)
    assert str(e.value).endswith(install_hint("provenance"))


# ---------------------------------------------------------------------------------- CLI


def _run(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, [line for line in out.err.splitlines() if line.strip()]


def test_cli_verify_exit_codes(signed, pair, tmp_path, capsys):
    _, path = signed
    code, out, err = _run(capsys, ["verify", str(path)])
    assert code == 0 and err == [], err
    assert "seed: 3" in out and f"sha256 {'ab' * 32}" in out
    code, out, _ = _run(capsys, ["verify", str(path), "--trust", str(pair.ca), "--json"])
    assert code == 0 and json.loads(out)["trusted"] is True

    tampered = tmp_path / "tampered.mp4"
    _tamper(path, tampered)
    code, out, err = _run(capsys, ["verify", str(tampered)])
    assert code == 1 and out == "" and len(err) == 1, err
    assert err[0] == (f"vidgen: error: {tampered} fails verification: the video's data hash does not match its "
                      "manifest: the pixels (or sound) were changed after signing")
    code, _, err = _run(capsys, ["verify", str(signed[0])])
    assert code == 1 and err == [f"vidgen: error: {signed[0]} fails verification: it has no C2PA manifest"]

    for argv, needle in ((["verify", str(tmp_path / "missing.mp4")], "does not exist"),
                         (["verify", str(tmp_path)], "is a folder, not a file"),
                         (["verify", str(path), "--trust", str(pair.key)], "holds no PEM certificate")):
        code, out, err = _run(capsys, argv)
        assert code == 2 and len(err) == 1 and err[0].startswith("vidgen: error:") and needle in err[0], err
        assert "Traceback" not in err[0]


# ---------------------------------------------------------------------------------- watermark


def test_watermark_survives_h264_crf23():
    """The acceptance bar: found after libx264 CRF 23 yuv420p in at least 9 of 10 clips (measured:
    10 of 10, scores 0.66-0.82 against a threshold of 0.25)."""
    results = [watermark.detect(_h264([watermark.embed(f) for f in _frames(seed)])) for seed in range(10)]
    found = sum(r.found for r in results)
    assert found >= 9, [r.summary() for r in results]
    assert min(r.score for r in results) > 2 * watermark.THRESHOLD


def test_watermark_is_not_found_in_unmarked_clips():
    """... and in none of 10 unmarked clips (measured: scores -0.04..0.06 against 0.25)."""
    results = [watermark.detect(_h264(_frames(100 + seed))) for seed in range(10)]
    assert not any(r.found for r in results), [r.summary() for r in results]
    assert max(r.score for r in results) < watermark.THRESHOLD / 2


def test_watermark_is_invisible_enough_and_kept_for_16_bit_frames():
    frame = _frames(5, 1)[0]
    marked = watermark.embed(frame)
    psnr = 10 * np.log10(255 ** 2 / np.mean((marked.astype(float) - frame) ** 2))
    assert psnr > 38, psnr
    assert watermark.detect([marked]).found and not watermark.detect([frame]).found
    deep = frame.astype(np.uint16) * 257
    assert watermark.detect([watermark.embed(deep)]).found and not watermark.detect([deep]).found
    assert watermark.PAYLOAD.sum() == 16            # balanced: a flat frame scores 0
    assert not watermark.detect([np.full((256, 256, 3), 128, np.uint8)]).found


def test_a_frame_too_small_for_the_watermark_is_an_error():
    with pytest.raises(ConfigError, match=r"frames of 64x64 are too small for the invisible watermark: it needs at "
                                          r"least 65,536 pixels"):
        watermark.embed(np.zeros((64, 64, 3), np.uint8))
    assert watermark.size_problem(832, 480) is None and watermark.size_problem(256, 255)
    with pytest.raises(ValueError, match="dtype"):
        watermark.embed(np.zeros((256, 256, 3), np.float32))


def test_watermark_is_invisible_watermarks_dwtDctSvd():
    """Our vectorised embedder writes what invisible-watermark's decoder reads, and the other way round."""
    pytest.importorskip("imwatermark")
    cv2 = pytest.importorskip("cv2")
    from imwatermark import WatermarkDecoder, WatermarkEncoder

    payload = bytes.fromhex(watermark.PAYLOAD_HEX)
    decoder, encoder = WatermarkDecoder("bytes", 32), WatermarkEncoder()
    encoder.set_watermark("bytes", payload)
    frame = _frames(7, 1)[0]
    ours = watermark.embed(frame)
    assert decoder.decode(cv2.cvtColor(ours, cv2.COLOR_RGB2BGR), "dwtDctSvd") == payload
    theirs = cv2.cvtColor(encoder.encode(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR), "dwtDctSvd"), cv2.COLOR_BGR2RGB)
    assert watermark.detect([theirs]).score > 0.9


def test_verify_checks_the_watermark_a_manifest_declares(pair, tmp_path):
    frames = _frames(11, 6)
    marked, unmarked = tmp_path / "marked.mp4", tmp_path / "unmarked.mp4"
    _encode([watermark.embed(f) for f in frames], marked)
    _encode(frames, unmarked)
    claims = {**CLAIMS, "watermark": watermark.CLAIM}
    for src in (marked, unmarked):
        provenance.sign(src, tmp_path / f"signed-{src.name}", key=pair.key, cert=pair.cert, claims=claims)
    report = provenance.verify(tmp_path / "signed-marked.mp4")
    assert report.ok and report.watermark == "found", report
    report = provenance.verify(tmp_path / "signed-unmarked.mp4")
    assert not report.ok and report.manifest == "valid" and report.watermark == "not found"
    assert report.problems[0].startswith("the invisible watermark its manifest declares is not in the frames")
    # the manifest stripped by a re-encode: the watermark still says vidgen made it
    report = provenance.verify(marked)
    assert report.manifest == "none" and report.watermark == "found"
    assert "the vidgen watermark is in its frames" in report.problems[0]


# ---------------------------------------------------------------------------------- hashes


def test_file_sha256_is_cached_by_path_size_and_mtime(monkeypatch, tmp_path, caplog):
    import hashlib

    import vidgen.lora

    monkeypatch.setenv("VIDGEN_CACHE", str(tmp_path / "cache"))
    calls = []
    real = vidgen.lora.sha256_of
    monkeypatch.setattr(vidgen.lora, "sha256_of", lambda p: calls.append(p) or real(p))
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights" * 100)
    expected = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert provenance.file_sha256(weights) == expected and len(calls) == 1
    assert provenance.file_sha256(weights) == expected and len(calls) == 1       # from the cache
    assert json.loads((tmp_path / "cache" / "sha256.json").read_text())[str(weights.resolve())]["sha256"] == expected
    weights.write_bytes(b"other weights")
    assert provenance.file_sha256(weights) == hashlib.sha256(b"other weights").hexdigest() and len(calls) == 2

    (tmp_path / "cache" / "sha256.json").write_text("{not json")
    provenance._warned.clear()
    with caplog.at_level(logging.WARNING, logger="vidgen"):
        assert provenance.file_sha256(weights) == hashlib.sha256(b"other weights").hexdigest()
        provenance.file_sha256(weights)
    assert len([r for r in caplog.records if "ignoring the hash cache" in r.getMessage()]) == 1
    assert json.loads((tmp_path / "cache" / "sha256.json").read_text())          # rewritten whole


def test_model_digests_of_a_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("VIDGEN_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    for rel in ("transformer/diffusion_pytorch_model-00001-of-00002.safetensors", "vae/Wan2.1_VAE.pth",
                "text_encoder/model.gguf", "transformer/config.json", ".cache/huggingface/x.safetensors"):
        (model / rel).parent.mkdir(parents=True, exist_ok=True)
        (model / rel).write_bytes(rel.encode())
    digests = provenance.model_digests(model)
    assert list(digests) == ["text_encoder/model.gguf",
                             "transformer/diffusion_pytorch_model-00001-of-00002.safetensors", "vae/Wan2.1_VAE.pth"]
    vae = digests["vae/Wan2.1_VAE.pth"]
    assert provenance.model_digests(model / "vae" / "Wan2.1_VAE.pth") == {"Wan2.1_VAE.pth": vae}


# ---------------------------------------------------------------------------------- renders


def test_a_signed_demo_render_verifies_and_a_changed_frame_fails(base_cfg, tiny_model, pair, tmp_path, capsys):
    """The acceptance: `vidgen verify` of a signed render exits 0 printing the model's hashes and the seed;
    after one frame is changed and the file re-muxed (its manifest carried over), exit 1 and one line."""
    import vidgen

    cfg = base_cfg(provenance={"key": str(pair.key), "cert": str(pair.cert)})
    result = vidgen.render(cfg)
    capsys.readouterr()
    assert main(["verify", str(result.path)]) == 0
    out = capsys.readouterr().out
    digests = provenance.model_digests(tiny_model())
    assert digests and all(f"sha256 {sha}" in out for sha in digests.values()), out
    assert "seed: 7" in out and "trainedAlgorithmicMedia" in out
    tampered = tmp_path / "tampered.mp4"
    _tamper(result.path, tampered, frame=4)
    assert main(["verify", str(tampered)]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "data hash does not match" in err[0], err


def test_a_watermarked_master_in_mxf_signs_into_a_sidecar(base_cfg, pair, tmp_path, capsys):
    import vidgen

    out = tmp_path / "out" / "clip.mxf"
    cfg = base_cfg(size="256x256", fps=24, provenance={"key": str(pair.key), "cert": str(pair.cert), "watermark": True},
                   output={"path": str(out)})
    result = vidgen.render(cfg)
    assert provenance.c2pa_sidecar(result.path).is_file()
    report = provenance.verify(result.path)
    assert report.ok and report.watermark == "found", report
    assert main(["verify", str(result.path)]) == 0


@pytest.mark.parametrize("extra, needle", [
    ({"output": {"codec": "exr", "path": "FRAMES"}, "provenance": "signs"}, "a folder of frames cannot carry"),
    ({"provenance": {"watermark": True}}, "too small for the invisible watermark"),
    ({"provenance": {"key": "KEY", "cert": "MISSING"}}, "provenance.cert"),
])
def test_provenance_refusals_come_before_any_weights(base_cfg, pair, tmp_path, capsys, monkeypatch, extra, needle):
    import yaml
    from hostile import assert_refused, untouched

    import vidgen.pipeline

    monkeypatch.setattr(vidgen.pipeline, "load_components", lambda *a, **k: pytest.fail("weights were loaded"))
    if extra.get("provenance") == "signs":
        extra = {**extra, "provenance": {"key": str(pair.key), "cert": str(pair.cert)}}
        extra["output"]["path"] = str(tmp_path / "out" / "frames")
    if extra.get("provenance", {}).get("cert") == "MISSING":
        extra["provenance"] = {"key": str(pair.key), "cert": str(tmp_path / "no-such-cert.pem")}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(base_cfg(**extra)))
    with untouched(tmp_path):
        code = main(["render", str(path), "-q"])
    assert_refused(code, capsys.readouterr().err, needle)


def test_a_signed_stitch_carries_its_shots_as_ingredients(pair, tmp_path):
    """A workflow's film: signed with each shot (itself signed) an ingredient; verify lists them."""
    from vidgen.queue.steps import run_stitch

    shots = []
    for n in range(2):
        plain, shot = tmp_path / f"plain{n}.mp4", tmp_path / f"shot{n}.mp4"
        _encode(_frames(n, 6, 64), plain)
        provenance.sign(plain, shot, key=pair.key, cert=pair.cert, claims={**CLAIMS, "seed": 10 + n}, title=shot.name)
        shots.append(str(shot))
    film = run_stitch({"inputs": shots, "output": str(tmp_path / "film.mp4"), "fps": 8, "crossfade": 0.25,
                       "provenance": {"key": str(pair.key), "cert": str(pair.cert)}, "names": ["a", "b"]})
    report = provenance.verify(film)
    assert report.ok, report
    text = "\n".join(report.lines)
    assert "ingredient: shot0.mp4 (componentOf; vidgen 0.1.0, seed 10)" in text, text
    assert "ingredient: shot1.mp4 (componentOf; vidgen 0.1.0, seed 11)" in text, text
    assert report.claims["shots"] == ["a", "b"]
