"""The script API (app/web/api/photo.py, docs/api.md) against a live server: the documented example
makes a real GLB, and what one client made no other client can reach."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from synthetic import make_object_image

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "api_client.py"
LOGIN = ("kiln", "test-secret")
MAX_PIXELS = 250_000
# small and fast on two CPU cores: a job takes seconds
FAST = {"worker.count": 1, "worker.device": "cpu", "reconstruct.resolution": 64,
        "reconstruct.num_gaussians": 3000, "reconstruct.max_image_side": 256, "views.count": 4,
        "views.resolution": 128, "bake.enabled": False, "app.max_pixels": MAX_PIXELS}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path_factory, name: str, env: dict | None = None):
    """``kiln serve`` as a person starts it, with a login: yields (url, its var folder)."""
    var = tmp_path_factory.mktemp(name)
    port = _free_port()
    sets = {**FAST, "app.jobs_dir": str(var / "jobs"), "app.cache_dir": str(var / "cache")}
    cmd = [sys.executable, "-m", "app", "--port", str(port), "--no-examples",
           "--auth", ":".join(LOGIN)] + [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    log = open(var / "server.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})})
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 120
    while True:
        try:
            httpx.get(url + "config", timeout=2)   # 401 without a login: it is up
            break
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("server did not start:\n" + (var / "server.log").read_text()[-3000:])
            time.sleep(0.5)
    try:
        yield url, var
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


# A job submitted with this seed sleeps in its 'mesh' stage until cancelled (a test-only
# fault rule picked by the job's seed), so it is running for as long as the test needs it
# to; no other job has it. One server serves the module (a server of its own for the held
# job cost a second app and worker start, issue 35).
HELD_SEED = 424242


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from _serve(tmp_path_factory, "api-server", {"KILN_TEST_FAULTS": f"hang@mesh:seed={HELD_SEED}"})


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("api-images")
    rgb, mask = make_object_image(160, "blob", seed=1)
    Image.fromarray(rgb).save(d / "photo.png")
    Image.fromarray(np.dstack([rgb, mask.astype(np.uint8) * 255])).save(d / "cutout.png")
    Image.fromarray(mask.astype(np.uint8) * 255).save(d / "mask.png")
    Image.fromarray(np.zeros((90, 120), np.uint8)).save(d / "wrong-size-mask.png")
    Image.fromarray(np.full((600, 600, 3), 128, np.uint8)).save(d / "too-many-pixels.png")
    # over the byte limit that goes with MAX_PIXELS (kiln.imageio.upload_limit_bytes)
    (d / "too-many-bytes.png").write_bytes(np.random.default_rng(0).bytes(4 << 20))
    return d


def _client(url, tmp_path, **kw):
    from gradio_client import Client

    return Client(url, auth=LOGIN, verbose=False, download_files=str(tmp_path), **kw)


def test_docs_show_the_example_as_it_is():
    docs = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", docs, re.S)
    assert EXAMPLE.read_text() in blocks, "docs/api.md must show examples/api_client.py verbatim"
    # every endpoint is documented
    from app.web.api.endpoints import ENDPOINTS

    for name in ENDPOINTS:
        assert f"### `/{name}`" in docs


def test_example_makes_a_glb_that_no_other_client_can_fetch(server, images, tmp_path):
    from gradio_client.exceptions import AppError

    from kiln.glb import check_glb_light

    url, var = server
    out = tmp_path / "model.glb"
    proc = subprocess.run([sys.executable, str(EXAMPLE), url, str(images / "photo.png"),
                           "--mask", str(images / "mask.png"), "-o", str(out), "--auth", ":".join(LOGIN),
                           "--set", "views=4", "--set", "seed=7"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GRADIO_TEMP_DIR": str(tmp_path / "client")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "mask from file (28.8% of the image)" in proc.stdout
    job = re.search(r"job (\S+) done in", proc.stdout).group(1)
    assert check_glb_light(out)["meshes"] >= 1

    # the server published it for the example's client only
    # published under the image's name, as the page's results are
    published = list((var / "gradio" / "results").glob("*/photo-1.glb"))
    assert len(published) == 1 and published[0].read_bytes() == out.read_bytes()
    other = _client(url, tmp_path / "other")
    try:
        with pytest.raises(AppError, match="no job .* of this client"):
            other.predict(job, api_name="/result")
        assert other.predict(api_name="/status") == {"jobs": [], "running": []}
        file_url = url + "gradio_api/file=" + str(published[0])
        assert httpx.get(file_url, cookies=other.cookies).status_code == 403
        assert httpx.get(file_url).status_code == 401   # no login at all
    finally:
        other.close()


def test_example_with_mask_auto_lets_the_server_find_the_object(server, tmp_path):
    """/generate's mask "auto" through gradio_client: a JPEG of an object on a gradient makes a
    GLB and says how the object was found; a noisy photo is refused with the reason."""
    from composites import composite

    url, _ = server
    photo, _ = composite("toy", "gradient", size=200, canvas=(240, 320))
    Image.fromarray(photo).save(tmp_path / "shot.jpg", quality=85)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (240, 320, 3), dtype=np.uint8)) \
        .save(tmp_path / "noise.jpg", quality=85)
    env = {**os.environ, "GRADIO_TEMP_DIR": str(tmp_path / "client")}
    run = [sys.executable, str(EXAMPLE), url, "--mask", "auto", "--auth", ":".join(LOGIN)]
    proc = subprocess.run([*run, str(tmp_path / "shot.jpg"), "-o", str(tmp_path / "shot.glb")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert re.search(r"object found by border-model \(\d+\.\d% of the image\)", proc.stdout), proc.stdout
    assert (tmp_path / "shot.glb").stat().st_size > 1000
    proc = subprocess.run([*run, str(tmp_path / "noise.jpg")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 1
    assert "error: no single object found automatically: the background is not plain" in proc.stderr


def test_one_client_is_one_session_from_upload_to_result(server, images, tmp_path):
    from gradio_client import handle_file

    url, var = server
    a = _client(url, tmp_path / "a")
    try:
        info = a.predict(handle_file(str(images / "cutout.png")), api_name="/upload_image")
        assert info["mask"]["source"] == "alpha" and info["width"] == 160
        job = a.submit(api_name="/generate")
        updates = list(job)
        status, glb, ply, _ = job.result()
        assert status["state"] == "done" and ply is None
        assert Path(glb).name == "cutout-1.glb"   # named for the image, as the page names results
        assert [u[0]["state"] for u in updates][-1] == "done"
        assert Path(glb).read_bytes()[:4] == b"glTF"
        jobs = a.predict(api_name="/status")["jobs"]
        assert [j["job"] for j in jobs] == [status["job"]]
        again, glb2, _, _ = a.predict(status["job"], api_name="/result")
        assert again["job"] == status["job"] and Path(glb2).read_bytes() == Path(glb).read_bytes()
        assert a.predict(api_name="/cancel") == {"cancelled": []}
        # the files carry no server paths in what the client reads
        assert str(var) not in repr(jobs)
    finally:
        a.close()


def test_inputs_and_settings_refused_with_what_to_fix(server, images, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    url, _ = server
    c = _client(url, tmp_path)
    try:
        with pytest.raises(AppError, match="upload an image first"):
            c.predict(api_name="/generate")
        info = c.predict(handle_file(str(images / "photo.png")), None, True, api_name="/upload_image")
        assert info["mask"] is None and info["has_alpha"] is False
        with pytest.raises(AppError, match="select the object first"):
            c.predict(api_name="/generate")
        with pytest.raises(AppError, match=r"mask file wrong-size-mask.png is 120x90 pixels but the image is 160x160"):
            c.predict(handle_file(str(images / "photo.png")), handle_file(str(images / "wrong-size-mask.png")),
                      api_name="/upload_image")
        with pytest.raises(AppError, match=r"600x600 = 360,000 pixels; the limit is 250,000"):
            c.predict(handle_file(str(images / "too-many-pixels.png")), api_name="/upload_image")
        # gradio_client checks the server's byte limit before sending; the server refuses it anyway
        big = images / "too-many-bytes.png"
        with pytest.raises(ValueError, match="exceeds the maximum file size"):
            c.predict(handle_file(str(big)), api_name="/upload_image")
        sent = httpx.post(url + "gradio_api/upload", cookies=c.cookies,
                          files={"files": (big.name, big.read_bytes())})
        assert sent.status_code == 413 and "maximum allowed size" in sent.text
        c.predict(handle_file(str(images / "photo.png")), api_name="/upload_image")
        picked = c.predict([[80, 80, 1]], api_name="/select")
        assert picked["mask"]["source"] == "prompt" and 0.2 < picked["mask"]["share"] < 0.4
        with pytest.raises(AppError, match="points: a label is 1"):
            c.predict([[80, 80, 3]], api_name="/select")
        for kw, message in [({"seed": -1}, r"seed: -1 is out of range.*\(setting 'seed'\)"),
                            ({"views": 0}, r"views: 0 is out of range; allowed 1 to 64 \(setting 'views.count'\)"),
                            ({"texture_size": 777}, r"texture_size: 777 must be a power of two"),
                            ({"bake_mode": "best"}, r"bake_mode: 'best' is not allowed; choose one of fast, opt"),
                            ({"simplify_ratio": 2}, r"simplify_ratio: 2(\.0)? is out of range")]:
            with pytest.raises(AppError, match=message):
                c.predict(**kw, api_name="/generate")
        # the pages' own events are not part of the API
        from app.web.api.endpoints import ENDPOINTS

        named = c.view_api(print_info=False, return_format="dict")["named_endpoints"]
        assert sorted(named) == sorted(f"/{n}" for n in ENDPOINTS)
    finally:
        c.close()


def test_without_the_login_nothing_answers(server):
    from gradio_client import Client
    from gradio_client.exceptions import AuthenticationError

    url, _ = server
    with pytest.raises(AuthenticationError):
        Client(url, verbose=False)
    assert httpx.post(url + "gradio_api/upload", files={"files": ("a.png", b"x" * 100)}).status_code == 401


def test_fit_camera_then_bake_with_it_through_gradio_client(server, tmp_path):
    """/fit_camera on a real model and its photo: the camera file, the figures and the picture
    reach the client; /bake given that file as fitted bakes without fitting again and answers
    the picture too; another client cannot fetch either file."""
    from gradio_client import handle_file

    from fit_helpers import fit_scene, rotation_error_deg
    from kiln.glb import check_glb_light
    from pipeline.io.camera_file import read_camera
    from pipeline.raster.rasterize import available_backends

    if "moderngl" not in available_backends():
        pytest.skip("no EGL OpenGL context on this machine (the scene is drawn with it)")
    url, var = server
    scene = fit_scene(tmp_path / "scene")
    c = _client(url, tmp_path / "a")
    other = _client(url, tmp_path / "b")
    try:
        files = dict(splat=None, image=handle_file(str(scene.photo)), mask=handle_file(str(scene.mask)))
        job = c.submit(handle_file(str(scene.mesh)), **files, api_name="/fit_camera")
        status, camera, picture = job.result()
        assert status["state"] == "done" and status["stage"] == "fit"
        fit = status["camera_fit"]
        assert fit["silhouette_iou"] > 0.95 and fit["fit_case"] == "canonical" and fit["fit_seconds"] > 0
        assert status["photo_projection"]["projected"] is True
        assert Path(camera).name == "model.camera.json" and Path(picture).name == "model.camera_fit.png"
        assert rotation_error_deg(read_camera(camera).viewmat, scene.camera.viewmat) < 3.0
        assert np.asarray(Image.open(picture)).shape == (240, 320, 3)

        job = c.submit(handle_file(str(scene.mesh)), **files, camera=handle_file(camera), camera_fitted=True,
                       texture_size=256, api_name="/bake")
        status, glb, ply, extra, baked_picture = job.result()
        assert status["state"] == "done" and check_glb_light(glb)["meshes"] >= 1
        assert status["camera_fit"]["fit_seconds"] == fit["fit_seconds"], "the fit's own figures: no second fit"
        assert Path(baked_picture).name == "model-1.camera_fit.png"
        # neither the fit's camera nor its picture reaches another client
        for name in ("model.camera.json", "model.camera_fit.png"):
            published, = (var / "gradio" / "canvas").glob(f"*/{name}")
            file_url = url + "gradio_api/file=" + str(published)
            assert httpx.get(file_url, cookies=c.cookies, auth=LOGIN).status_code == 200
            assert httpx.get(file_url, cookies=other.cookies, auth=LOGIN).status_code == 403
        assert other.predict(api_name="/status") == {"jobs": [], "running": []}
    finally:
        c.close()
        other.close()


def test_a_file_reference_gradio_refuses_is_answered_with_the_reason(server, images, tmp_path):
    """A URL on the server's own network and a path on the server are not read (Gradio
    refuses both before any handler runs): the client is told why and what to send instead,
    not ``{"error": null}``."""
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    url, var = server
    c = _client(url, tmp_path)
    try:
        with pytest.raises(AppError, match=r"image: the server does not fetch http://127\.0\.0\.1.*handle_file"):
            c.predict(handle_file(url + "config"), api_name="/upload_image")
        # a path gradio_client would upload; sent as a bare reference, as another client can
        secret = var / "server.log"
        sent = httpx.post(url + "gradio_api/call/upload_image", cookies=c.cookies, timeout=30,
                          json={"data": [{"path": str(secret), "meta": {"_type": "gradio.FileData"}}, None, True]})
        event = sent.json()["event_id"]
        answer = httpx.get(url + f"gradio_api/call/upload_image/{event}", cookies=c.cookies, timeout=30).text
        assert "event: error" in answer and "server.log is a path on the server" in answer, answer
        assert str(var) not in answer, "the server's own folders are nobody's business at the client"
        # an upload of the file itself still works
        info = c.predict(handle_file(str(images / "photo.png")), None, True, api_name="/upload_image")
        assert info["has_alpha"] is False and info["mask"] is None
    finally:
        c.close()


# last in the module: cancelling a running job stops its worker, and no later test then
# waits for the server's worker to start again
def test_cancel_reaches_only_the_callers_job(server, images, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    url, _ = server
    a, b = _client(url, tmp_path / "a"), _client(url, tmp_path / "b")
    try:
        a.predict(handle_file(str(images / "cutout.png")), api_name="/upload_image")
        job = a.submit(seed=HELD_SEED, api_name="/generate")   # held in 'mesh' until cancelled
        deadline = time.monotonic() + 120
        while True:
            running = a.predict(api_name="/status")
            if running["running"] and running["jobs"][-1]["stage"] == "mesh":
                break
            assert time.monotonic() < deadline, running
            time.sleep(0.5)
        job_id = running["running"][0]
        with pytest.raises(AppError, match="upload an image first"):
            b.predict(api_name="/generate")   # b's session has no image: a's is not shared
        assert b.predict(api_name="/cancel") == {"cancelled": []}
        assert a.predict(api_name="/status")["jobs"][-1]["state"] == "running"
        with pytest.raises(AppError, match="already has a job running"):
            a.predict(api_name="/generate")
        assert a.predict(api_name="/cancel") == {"cancelled": [job_id]}
        with pytest.raises(AppError, match=f"job {job_id} cancelled"):
            job.result(timeout=60)
        assert a.predict(api_name="/status")["jobs"][-1]["state"] == "cancelled"
    finally:
        a.close()
        b.close()
