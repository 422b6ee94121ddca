"""The queue page in a real browser: headless Debian Chromium driven by Selenium (chromium-driver), against
a live `vidgen queue serve` and a worker rendering demo jobs. Skipped, saying why, where Chromium,
its driver or Selenium is missing (.ci/run installs them)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base: str, path: str, body: dict | None = None, method: str | None = None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method or ("POST" if body is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _until(what: str, fn, timeout: float = 120.0, every: float = 0.25):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if value := fn():
                return value
        except Exception:  # noqa: BLE001 - the page or the service may be between states
            pass
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _chromium(webdriver, base: str):
    """Headless Chromium on the page at `base`, videos allowed to play without a click."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,800",
                "--autoplay-policy=no-user-gesture-required"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER), options=options)
    driver.get(base + "/")
    return driver


@pytest.mark.slow
@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver (apt-get install "
                                                      "chromium chromium-driver; .ci/run does)")
def test_the_page_in_chromium(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By

    port, db = _free_port(), tmp_path / "q.db"
    env = {**os.environ, "VIDGEN_QUEUE": str(db)}
    server = subprocess.Popen([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "serve", "--port", str(port),
                               "--root", str(tmp_path), "--root", str(ROOT)], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    worker = driver = None
    try:
        _until("the service", lambda: _api(base, "/api/jobs") is not None, 30)
        cfg = json.loads(json.dumps({"model": {"path": str(ROOT / "samples" / "demo-wan"), "device": "cpu",
                                               "max_sequence_length": 16},
                                     "size": "64x64", "num_frames": 17, "fps": 8, "sampling": {"steps": 30},
                                     "output": {"path": str(tmp_path / "out" / "clip-{seed}.mp4")}}))
        prompts = ["a red circle moving right on a black background", "a blue square moving up on a gray background",
                   "a yellow triangle moving left on a black background", "a green circle moving down on a gray background"]
        # Long renders where the test must catch a job in the middle, whatever the machine's speed: the one
        # moved to the top (progress, a preview, then canceled while it runs) and the one whose worker dies.
        steps = {0: 30, 1: 1000, 2: 30, 3: 1000}
        ids = [_api(base, "/api/jobs", {"config": {**cfg, "prompt": p, "seed": i},
                                        "overrides": [f"sampling.steps={steps[i]}"]})["ids"][0]
               for i, p in enumerate(prompts)]
        driver = _chromium(webdriver, base)
        rows = lambda: driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-id]")   # noqa: E731
        _until("the jobs table", lambda: len(rows()) == 4, 30)
        # Reorder: the last job up twice (above its neighbours), seen by the API.
        for _ in range(2):
            row = driver.find_element(By.CSS_SELECTOR, f"tr[data-id='{ids[3]}']")
            row.find_element(By.CSS_SELECTOR, "button[data-action='up']").click()
            time.sleep(0.5)
        _until("the new priority", lambda: _api(base, f"/api/jobs/{ids[3]}")["priority"] == 2, 15)
        # Cancel one queued job from the page.
        driver.find_element(By.CSS_SELECTOR, f"tr[data-id='{ids[2]}'] button[data-action='cancel']").click()
        _until("the canceled job", lambda: driver.find_element(By.CSS_SELECTOR, f"tr[data-id='{ids[2]}'] td.state")
               .text == "canceled", 15)
        worker = subprocess.Popen([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "worker",
                                   "--exit-when-idle", "--lease", "4"], cwd=tmp_path, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # The reordered job runs first; its progress moves in the page (events, no reload).

        def width() -> float:
            bar = driver.find_element(By.CSS_SELECTOR, f"tr[data-id='{ids[3]}'] .bar > span")
            return float(bar.get_attribute("style").split("width:")[1].split("%")[0])
        first = _until("progress", lambda: (w := width()) > 0 and w < 100 and w, 120, 0.05)
        _until("progress to move", lambda: width() > first, 60, 0.05)
        # A preview of the render in progress appears in its row (an image that loaded).
        _until("a preview", lambda: driver.execute_script(
            f"const i = document.querySelector(\"tr[data-id='{ids[3]}'] img.preview\");"
            "return !!i && i.complete && i.naturalWidth > 0;"), 60, 0.05)
        shots = Path(__file__).parent.parent / "docs" / "images"
        if os.environ.get("VIDGEN_SCREENSHOT"):     # docs/images/queue-dashboard.png, part way through sampling
            _until("a third of the way", lambda: width() >= 33, 120, 0.05)
            shots.mkdir(exist_ok=True)
            driver.save_screenshot(str(shots / "queue-dashboard.png"))
        # Cancel it while it runs: it stops at its next step, and its preview goes with it.
        driver.find_element(By.CSS_SELECTOR, f"tr[data-id='{ids[3]}'] button[data-action='cancel']").click()
        _until("the running job canceled", lambda: driver.find_element(
            By.CSS_SELECTOR, f"tr[data-id='{ids[3]}'] td.state").text == "canceled", 60)
        assert _api(base, f"/api/jobs/{ids[2]}")["state"] == "canceled"
        # The next job (a short one) finishes, and its clip plays in the page.
        _until("the next job to finish", lambda: driver.find_element(
            By.CSS_SELECTOR, f"tr[data-id='{ids[0]}'] td.state").text == "succeeded", 120)
        driver.find_element(By.CSS_SELECTOR, f"tr[data-id='{ids[0]}'] td.name").click()
        _until("the clip to play", lambda: driver.execute_script(
            "const v = document.querySelector('#player'); if (!v) return false; v.play();"
            "return v.readyState >= 2 && v.duration > 0 && !v.error && v.currentTime > 0;"), 30)
        # The worker dies during the job after it: once its lease runs out the page shows the job
        # re-queued, not running forever (no event comes for an expiry: the page redraws on its own).
        _until("the last job to run", lambda: _api(base, f"/api/jobs/{ids[1]}")["state"] == "running", 60)
        worker.kill()
        worker.wait()
        _until("the dead worker's job shown re-queued", lambda: driver.find_element(
            By.CSS_SELECTOR, f"tr[data-id='{ids[1]}'] td.state").text == "re-queued", 30)
    finally:
        for proc in (worker, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
        if driver is not None:
            driver.quit()


@pytest.mark.slow
@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver (apt-get install "
                                                      "chromium chromium-driver; .ci/run does)")
def test_a_review_in_chromium(tmp_path):
    """A shot of 2 takes awaiting review: the page plays both takes side by side; approving take 2 there
    queues the shot's full decode, and what follows it (the stitch) then runs."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By

    port, db = _free_port(), tmp_path / "q.db"
    env = {**os.environ, "VIDGEN_QUEUE": str(db)}
    (tmp_path / "wf.yaml").write_text(
        f"name: rv\noutput_dir: {tmp_path / 'out'}\ndefaults: {{config: {ROOT / 'configs' / 'demo.yaml'}, "
        f"model.path: {ROOT / 'samples' / 'demo-wan'}, sampling.steps: 4, seed: 1}}\nshots:\n"
        "  - {name: hero, prompt: a red circle moving right on a black background, takes: 2, review: true}\n"
        "steps:\n  stitch: {output: film.mp4}\n")
    server = subprocess.Popen([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "serve", "--port", str(port),
                               "--root", str(tmp_path), "--root", str(ROOT)], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base, driver = f"http://127.0.0.1:{port}", None
    try:
        _until("the service", lambda: _api(base, "/api/jobs") is not None, 30)
        ids = _api(base, "/api/jobs", {"workflow": str(tmp_path / "wf.yaml")})["ids"]
        review, stitch = ids[2], ids[3]
        subprocess.run([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "worker", "--exit-when-idle"],
                       cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300,
                       check=True)
        assert _api(base, f"/api/jobs/{review}")["state"] == "awaiting_review"
        driver = _chromium(webdriver, base)
        _until("the review row", lambda: driver.find_element(By.CSS_SELECTOR, f"tr[data-id='{review}'] td.state")
               .text == "awaiting_review", 30)
        driver.find_element(By.CSS_SELECTOR, f"tr[data-id='{review}'] td.name").click()
        # Both takes play, side by side (one row: the same top edge).
        _until("both takes playing", lambda: driver.execute_script(
            "const v = [...document.querySelectorAll('#takes video.take')];"
            "return v.length === 2 && v.every((x) => x.readyState >= 2 && !x.error && x.currentTime > 0)"
            " && v[0].getBoundingClientRect().top === v[1].getBoundingClientRect().top;"), 30)
        driver.find_element(By.CSS_SELECTOR, "#takes button.approve[data-take='2']").click()
        _until("the approval", lambda: _api(base, f"/api/jobs/{review}")["payload"].get("approved", {}).get("take") == 2,
               15)
        assert _api(base, f"/api/jobs/{review}")["state"] == "queued"
        subprocess.run([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "worker", "--exit-when-idle"],
                       cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300,
                       check=True)
        _until("the stitch shown done", lambda: driver.find_element(
            By.CSS_SELECTOR, f"tr[data-id='{stitch}'] td.state").text == "succeeded", 30)
        assert (tmp_path / "out" / "film.mp4").exists()
    finally:
        server.kill()
        if driver is not None:
            driver.quit()
