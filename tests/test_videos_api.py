"""The OpenAI-compatible /v1/videos facade: create, poll, download (a real MP4), auth, bad bodies,
unknown ids and models, and a client written against the documented shape (the openai package)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from vidgen.queue.ledger import Ledger  # noqa: E402
from vidgen.queue.service import create_app  # noqa: E402
from vidgen.queue.videos import VideoSettings, frames_for  # noqa: E402
from vidgen.queue.worker import run_worker  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

LOCAL = "http://127.0.0.1:8765"
TOKEN = "s3cret-token"


def _preset(folder: Path, name: str, model: Path, **extra) -> None:
    """A preset as an operator would write one: the shipped base, a model folder, small settings."""
    body = {"defaults": ["base.yaml"], "model": {"path": str(model), "device": "cpu"}, "size": "64x64",
            "num_frames": 5, "fps": 8, "sampling": {"steps": 2}, **extra}
    (folder / f"{name}.yaml").write_text(json.dumps(body))      # JSON is YAML


@pytest.fixture
def videos(tiny_model, tmp_path, monkeypatch):
    """make(**create_app kwargs) -> (TestClient, db path); presets `tiny` (Wan2.1 T2V, the default)
    and `tiny-ti2v` (takes an image) in a folder of the test's own."""
    monkeypatch.chdir(tmp_path)
    presets = tmp_path / "presets"
    presets.mkdir()
    _preset(presets, "tiny", tiny_model())
    _preset(presets, "tiny-ti2v", tiny_model("wan2.2-ti2v-5b"), size="64x64")
    db = tmp_path / "q.db"

    def make(**kw):
        settings = kw.pop("videos", VideoSettings(presets=presets, default_model="tiny"))
        app = create_app(db, roots=[tmp_path, Path(tiny_model()).parent], videos=settings, **kw)
        return TestClient(app, base_url=LOCAL), db
    return make


def _frames(data: bytes) -> int:
    av = pytest.importorskip("av")
    with av.open(io.BytesIO(data)) as f:
        return sum(1 for _ in f.decode(video=0))


def _one_line_error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json") and "Traceback" not in r.text
    assert "\n" not in r.text.strip() and len(r.text) < 4000
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["type"] == "invalid_request_error"
    return err


def test_create_poll_and_download(videos, tmp_path):
    client, db = videos()
    r = client.post("/v1/videos", json={"prompt": "a red circle moving right", "seconds": "1"})
    assert r.status_code == 200, r.text
    video = r.json()
    assert video["id"].startswith("video_") and video["object"] == "video" and video["status"] == "queued"
    assert video["model"] == "tiny" and video["size"] == "64x64" and video["progress"] == 0
    assert video["error"] is None and video["completed_at"] is None and video["expires_at"] is None
    assert isinstance(video["created_at"], int) and video["prompt"] == "a red circle moving right"
    # 1 s at 8 fps is 8 frames, not 4k+1: 9 are rendered, and the answer says so.
    assert video["vidgen"]["num_frames"] == 9 and video["seconds"] == "1.125"
    assert "rendering 9" in video["vidgen"]["notes"][0]
    job_id = video["vidgen"]["job_id"]
    assert video["id"] == f"video_{job_id}"
    texts = [t for _, _, t in Ledger(db).logs(job_id)]
    assert any("submitted by testclient (HTTP, POST /v1/videos" in t for t in texts)
    assert any("rendering 9" in t for t in texts)
    # The output lies in the output folder, inside the roots; the job shows in the queue as any other.
    job = client.get(f"/api/jobs/{job_id}").json()
    assert Path(job["output"]).parent == tmp_path / "videos"
    r = client.get(f"/v1/videos/{video['id']}/content")
    assert _one_line_error(r, 409)["code"] == "video_not_ready"

    assert run_worker(db, exit_when_idle=True, poll_s=0.05) == 1
    done = client.get(f"/v1/videos/{video['id']}").json()
    assert done["status"] == "completed" and done["progress"] == 100 and done["completed_at"] >= done["created_at"]
    r = client.get(f"/v1/videos/{video['id']}/content")
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4"
    assert _frames(r.content) == 9
    listed = client.get("/v1/videos").json()
    assert listed["object"] == "list" and [v["id"] for v in listed["data"]] == [video["id"]]
    assert listed["first_id"] == listed["last_id"] == video["id"] and listed["has_more"] is False
    r = client.delete(f"/v1/videos/{video['id']}")           # finished: nothing to cancel, the file stays
    assert _one_line_error(r, 409)["code"] == "video_not_cancelable"
    assert Path(job["output"]).is_file()


@pytest.mark.slow
def test_multipart_with_an_input_reference(videos, tmp_path):
    from PIL import Image

    client, db = videos()
    png = io.BytesIO()
    Image.new("RGB", (96, 64), (200, 30, 30)).save(png, format="PNG")
    files = {"input_reference": ("ref.png", png.getvalue(), "image/png")}
    data = {"prompt": "a red circle moving right", "model": "tiny-ti2v", "size": "64x64"}
    r = client.post("/v1/videos", data=data, files=files)
    assert r.status_code == 200, r.text
    video = r.json()
    assert video["model"] == "tiny-ti2v" and video["size"] == "64x64" and "notes" not in video["vidgen"]
    payload = client.get(f"/api/jobs/{video['vidgen']['job_id']}").json()["payload"]
    saved = Path(payload["image"])
    assert saved.parent == tmp_path / "videos" / "inputs" and saved.read_bytes() == png.getvalue()
    assert payload["image_fit"] == "crop"
    # A data: URL in JSON is the same image; a web URL is refused (nothing is fetched).
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    r = client.post("/v1/videos", json={**data, "input_reference": {"image_url": url}})
    assert r.status_code == 200, r.text
    r = client.post("/v1/videos", json={**data, "input_reference": {"image_url": "https://example.com/a.png"}})
    assert "fetches no URLs" in _one_line_error(r, 422)["message"]
    r = client.post("/v1/videos", data=data, files={"input_reference": ("x.png", b"not an image", "image/png")})
    assert _one_line_error(r, 422)["param"] == "input_reference"
    # A model that takes no image refuses it, and its upload is not left behind.
    r = client.post("/v1/videos", data={**data, "model": "tiny"}, files=files)
    _one_line_error(r, 422)
    assert len(list((tmp_path / "videos" / "inputs").iterdir())) == 2
    assert run_worker(db, exit_when_idle=True, poll_s=0.05) == 2
    r = client.get(f"/v1/videos/{video['id']}/content")
    assert r.status_code == 200 and _frames(r.content) == 5


def test_auth(videos):
    client, _ = videos(token=TOKEN)
    for method, url in (("POST", "/v1/videos"), ("GET", "/v1/videos"), ("GET", "/v1/videos/video_1"),
                        ("GET", "/v1/videos/video_1/content"), ("DELETE", "/v1/videos/video_1")):
        r = client.request(method, url, json={"prompt": "a red circle"} if method == "POST" else None)
        assert r.status_code == 401 and "token" in r.json()["error"], (url, r.text)
    assert client.get("/v1/videos", headers={"Authorization": "Bearer nope"}).status_code == 401
    r = client.post("/v1/videos", json={"prompt": "a red circle"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    assert client.get("/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).json()["jobs"]


@pytest.mark.parametrize("body, param, text", [
    ({}, "prompt", "prompt: is required"),
    ({"prompt": 3}, "prompt", "prompt: give a string"),
    ({"prompt": "a fox", "seconds": [4]}, "seconds", "seconds: give a number"),
    ({"prompt": "a fox", "seconds": "soon"}, "seconds", "not a positive number"),
    ({"prompt": "a fox", "seconds": "-1"}, "seconds", "not a positive number"),
    ({"prompt": "a fox", "seconds": "1e300"}, "seconds", "more than 16385 frames"),
    ({"prompt": "a fox", "size": "1280x721"}, "size", "not a multiple of 16"),
    ({"prompt": "a fox", "size": 720}, "size", "size: give a string"),
    ({"prompt": "a fox", "fps": 30}, None, "'fps': unknown field"),
    ({"prompt": "a fox", "model": "../../etc/passwd"}, "model", "allowed: tiny, tiny-ti2v"),
    ({"prompt": "a fox", "model": "vidgen.queue.api:submit"}, "model", "is not a model of this service"),
    ({"prompt": "a fox", "model": "sora-2"}, "model", "allowed: tiny, tiny-ti2v"),
    ({"prompt": "a fox", "input_reference": {"file_id": "file_1"}}, "input_reference", "no file store"),
    ({"prompt": "a \x00 fox"}, None, "NUL"),
])
def test_bad_bodies_are_422_and_queue_nothing(videos, body, param, text):
    client, db = videos()
    err = _one_line_error(client.post("/v1/videos", json=body), 422)
    assert text in err["message"] and err["param"] == param and err["code"] == "invalid_request", err
    assert any(text in p for p in err["problems"])
    assert Ledger(db).jobs() == []


@pytest.mark.parametrize("content, ctype", [
    (b"not json", "application/json"),
    (b"[1, 2]", "application/json"),
    (b'--b\r\nContent-Disposition: form-data; name="prompt"\r\n\r\na fox', "multipart/form-data; boundary=b"),
    (b"--b--\r\n", "multipart/form-data"),
    (b'--b\r\nContent-Disposition: form-data; name="prompt"\r\n\r\n\xff\r\n--b--\r\n',
     "multipart/form-data; boundary=b"),                                      # not UTF-8
    (b"prompt=a&prompt=b", "application/x-www-form-urlencoded"),
])
def test_malformed_bodies_are_422(videos, content, ctype):
    client, db = videos()
    _one_line_error(client.post("/v1/videos", content=content, headers={"Content-Type": ctype}), 422)
    assert Ledger(db).jobs() == []


def test_unknown_and_malformed_ids_are_404(videos):
    client, _ = videos()
    assert client.post("/v1/videos", json={"prompt": "a red circle"}).json()["id"] == "video_1"
    for vid in ("video_999", "video_0", "video_01", "video_-1", "video_12345678901234567890", "video_abc", "1",
                "vid%00eo", "video_1%0a", "video_1%20", "%ff%fe"):
        for url in (f"/v1/videos/{vid}", f"/v1/videos/{vid}/content"):
            err = _one_line_error(client.get(url), 404)
            assert err["code"] == "video_not_found" and err["param"] == "video_id", (url, err)
        _one_line_error(client.delete(f"/v1/videos/{vid}"), 404)
    assert client.get("/v1/videos/video_1").json()["status"] == "queued"      # nothing changed


@pytest.mark.slow
def test_a_job_submitted_elsewhere_is_not_a_video(videos, tmp_path):
    client, db = videos()
    cfg = {"model": {"path": str(Path(client.app.state.service.roots[1]) / "wan2.1-t2v"), "device": "cpu"},
           "prompt": "a red circle", "size": "64x64", "num_frames": 5, "fps": 8, "sampling": {"steps": 2},
           "output": {"path": str(tmp_path / "out" / "x.mp4")}}
    r = client.post("/api/jobs", json={"config": cfg})
    assert r.status_code == 201, r.text
    [job_id] = r.json()["ids"]
    _one_line_error(client.get(f"/v1/videos/video_{job_id}"), 404)
    assert client.get("/v1/videos").json()["data"] == []


@pytest.mark.slow
def test_list_pages_and_delete_cancels(videos, tmp_path):
    client, db = videos()
    ids = [client.post("/v1/videos", json={"prompt": f"a red circle {i}"}).json()["id"] for i in range(3)]
    page = client.get("/v1/videos", params={"limit": 2}).json()
    assert [v["id"] for v in page["data"]] == ids[::-1][:2] and page["has_more"] is True
    rest = client.get("/v1/videos", params={"limit": 2, "after": page["last_id"]}).json()
    assert [v["id"] for v in rest["data"]] == [ids[0]] and rest["has_more"] is False
    asc = client.get("/v1/videos", params={"order": "asc"}).json()
    assert [v["id"] for v in asc["data"]] == ids
    for params in ({"limit": "101"}, {"limit": "-1"}, {"order": "up"}, {"after": "x"}, {"page": "2"}):
        _one_line_error(client.get("/v1/videos", params=params), 422)
    gone = client.delete(f"/v1/videos/{ids[1]}")
    assert gone.status_code == 200 and gone.json() == {"id": ids[1], "object": "video.deleted", "deleted": False,
                                                       "vidgen": {"state": "canceled", "files_kept": True}}
    video = client.get(f"/v1/videos/{ids[1]}").json()
    assert video["status"] == "failed" and video["error"]["code"] == "canceled"
    assert _one_line_error(client.get(f"/v1/videos/{ids[1]}/content"), 409)["code"] == "video_not_ready"
    texts = [t for _, _, t in Ledger(db).logs(int(ids[1].removeprefix("video_")))]
    assert any("cancel by testclient" in t for t in texts)


def test_the_default_model_and_the_settings_checks(videos, tmp_path):
    from vidgen.errors import InputError
    from vidgen.presets import PRESETS

    client, _ = videos(videos=VideoSettings(presets=tmp_path / "presets"))
    r = client.post("/v1/videos", json={"prompt": "a red circle"})          # two presets, no default: say so
    assert "model: is required here" in _one_line_error(r, 422)["message"]
    (tmp_path / "presets" / "tiny-ti2v.yaml").unlink()
    client, _ = videos(videos=VideoSettings(presets=tmp_path / "presets"))
    assert client.post("/v1/videos", json={"prompt": "a red circle"}).json()["model"] == "tiny"    # the only one
    shipped = VideoSettings()
    assert shipped.default() == "wan2.2-ti2v-5b-720p" and "tiny" in shipped.models()
    assert "base" not in shipped.models() and "wan-base" not in shipped.models()
    assert Path(shipped.presets) == PRESETS
    with pytest.raises(InputError, match="outside the service's roots"):
        videos(videos=VideoSettings(presets=tmp_path / "presets", output_dir="/"))
    with pytest.raises(InputError, match="not a preset"):
        videos(videos=VideoSettings(presets=tmp_path / "presets", default_model="sora-2"))


def test_the_roots_and_the_guard_apply(videos, tmp_path):
    client, db = videos()
    presets = tmp_path / "presets"
    _preset(presets, "elsewhere", tmp_path.parent / f"{tmp_path.name}-models" / "wan")
    _preset(presets, "guarded", Path(client.app.state.service.roots[1]) / "wan2.1-t2v",
            guard={"enabled": True, "frames": False})
    r = client.post("/v1/videos", json={"prompt": "a red circle", "model": "elsewhere"})
    assert "outside the service's roots" in _one_line_error(r, 422)["message"]
    r = client.post("/v1/videos", json={"prompt": "a p.o.r.n scene", "model": "guarded"})
    err = _one_line_error(r, 403)
    assert err["code"] == "blocked_by_guard" and err["rule"] == "explicit" and err["param"] == "prompt"
    assert str(presets) not in r.text
    assert Ledger(db).jobs() == []


def test_an_upload_is_bounded_by_the_body_limit(videos, tmp_path):
    client, db = videos(max_body=4096)
    files = {"input_reference": ("big.png", b"\x89PNG\r\n\x1a\n" + b"x" * 8192, "image/png")}
    r = client.post("/v1/videos", data={"prompt": "a red circle", "model": "tiny-ti2v"}, files=files)
    assert r.status_code == 413 and not (tmp_path / "videos" / "inputs").exists()
    assert Ledger(db).jobs() == []


def test_seconds_to_frames():
    assert frames_for("1", 8) == (9, frames_for("1", 8)[1]) and "rendering 9" in frames_for("1", 8)[1]
    assert frames_for("4", 24)[0] == 97
    assert frames_for(2.125, 8) == (17, None)           # exactly 4k+1 frames: nothing to say
    assert frames_for("0.01", 8)[0] == 1


def test_an_openai_client_works_unchanged(videos):
    openai = pytest.importorskip("openai")
    client, db = videos(token=TOKEN)
    oa = openai.OpenAI(base_url=f"{LOCAL}/v1", api_key=TOKEN, http_client=client, max_retries=0)
    video = oa.videos.create(prompt="a red circle moving right", model="tiny", seconds="1", size="64x64")
    assert video.status == "queued" and video.model == "tiny" and video.object == "video"
    assert oa.videos.retrieve(video.id).status == "queued"
    with pytest.raises(openai.ConflictError):
        oa.videos.download_content(video.id)
    with pytest.raises(openai.NotFoundError):
        oa.videos.retrieve("video_424242")
    with pytest.raises(openai.UnprocessableEntityError, match="allowed: tiny"):
        oa.videos.create(prompt="a fox", model="sora-2")
    run_worker(db, exit_when_idle=True, poll_s=0.05)
    done = oa.videos.poll(video.id, poll_interval_ms=10)
    assert done.status == "completed" and done.progress == 100 and done.seconds == "1.125"
    assert _frames(oa.videos.download_content(video.id).read()) == 9
    assert [v.id for v in oa.videos.list()] == [video.id]
    unauthorised = openai.OpenAI(base_url=f"{LOCAL}/v1", api_key="wrong", http_client=client, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        unauthorised.videos.retrieve(video.id)
