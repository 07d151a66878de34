"""The model repository over real HTTP: broken artifacts beside a good one, required models, a new version
appearing while requests run, and the per-version metric series following the repository."""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import time
import weakref
from pathlib import Path

import httpx
import numpy as np

from tests.service.conftest import (
    copy_version,
    metric_value,
    random_pixels,
    serve,
    settings_for,
    until,
    wait_for,
)


def break_artifacts(tiny_artifact: Path, repository: Path) -> None:
    corrupt = copy_version(tiny_artifact, repository, "corrupt", "1")
    data = bytearray((corrupt / "director.ts").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (corrupt / "director.ts").write_bytes(bytes(data))
    future = copy_version(tiny_artifact, repository, "future", "1")
    manifest = json.loads((future / "manifest.json").read_text())
    (future / "manifest.json").write_text(json.dumps({**manifest, "format_version": "2.0"}))
    garbage = copy_version(tiny_artifact, repository, "garbage", "1")
    (garbage / "manifest.json").write_text("{not json")
    (repository / "empty" / "1").mkdir(parents=True)


def test_broken_artifacts_are_reported_and_do_not_take_the_good_one_down(tiny_artifact: Path, tmp_path: Path
                                                                         ) -> None:
    repository = tmp_path / "repo"
    copy_version(tiny_artifact, repository, "tiny", "1")
    break_artifacts(tiny_artifact, repository)
    with serve(settings_for(repository, tmp_path)) as server:
        models = {m["name"]: m for m in httpx.get(f"{server.url}/models").json()["models"]}
        assert models["tiny"]["versions"][0]["state"] == "ready"
        reasons = {name: models[name]["versions"][0] for name in ("corrupt", "future", "garbage", "empty")}
        assert all(v["state"] == "unavailable" for v in reasons.values())
        assert "sha256" in reasons["corrupt"]["reason"]
        assert "format_version 2.0" in reasons["future"]["reason"]
        assert "not valid JSON" in reasons["garbage"]["reason"]
        assert "missing" in reasons["empty"]["reason"]
        detail = httpx.get(f"{server.url}/models/corrupt").json()
        assert detail["default_version"] is None and detail["versions"][0]["state"] == "unavailable"
        ready = httpx.get(f"{server.url}/health/ready")
        assert ready.status_code == 200  # nothing broken is required
        body = {"inputs": [{"pixels": random_pixels(np.random.default_rng(0))[0]}]}
        assert httpx.post(f"{server.url}/predict", json=body, timeout=30).status_code == 200
        refused = httpx.post(f"{server.url}/predict", json={**body, "model": "corrupt", "version": "1"}, timeout=30)
        assert refused.status_code == 503 and "sha256" in refused.json()["error"]
        text = httpx.get(f"{server.url}/metrics").text
        assert 'director_model_info{method="director",model="corrupt",state="unavailable",version="1"} 1.0' in text


def test_required_models_gate_readiness(tiny_artifact: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    copy_version(tiny_artifact, repository, "tiny", "1")
    break_artifacts(tiny_artifact, repository)
    with serve(settings_for(repository, tmp_path, required_models=["tiny", "corrupt", "absent"]),
               wait_ready=False) as server:
        ready = httpx.get(f"{server.url}/health/ready")
        assert ready.status_code == 503
        assert ready.json()["missing_required"] == ["corrupt", "absent"]
        assert httpx.get(f"{server.url}/health/live").status_code == 200
    with serve(settings_for(repository, tmp_path, required_models=["tiny"])) as server:
        assert httpx.get(f"{server.url}/health/ready").json()["status"] == "ready"


def test_empty_repository_is_live_but_not_ready(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    with serve(settings_for(tmp_path / "repo", tmp_path), wait_ready=False) as server:
        assert httpx.get(f"{server.url}/health/live").json()["status"] == "alive"
        assert httpx.get(f"{server.url}/health/ready").status_code == 503
        response = httpx.post(f"{server.url}/predict", json={"inputs": [{"pixels": [[0.0]]}]})
        assert response.status_code == 404


def test_new_version_is_picked_up_while_requests_run(tiny_artifact: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    copy_version(tiny_artifact, repository, "tiny", "1")
    rng = np.random.default_rng(1)
    with serve(settings_for(repository, tmp_path, poll_interval_s=0.1)) as server:

        async def hammer() -> list[httpx.Response]:
            responses: list[httpx.Response] = []
            stop_at = time.monotonic() + 30
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:

                async def client_loop() -> None:
                    while time.monotonic() < stop_at:
                        r = await client.post("/predict", json={"inputs": [{"pixels": random_pixels(rng)[0]}],
                                                                "n_samples": 2})
                        responses.append(r)
                        if r.status_code != 200 or r.json()["model_version"] == "2" and len(
                                [x for x in responses if x.status_code == 200 and x.json()["model_version"] == "2"]
                        ) >= 10:
                            return

                async def publish() -> None:  # once version 1 has answered the clients' first requests
                    await until(lambda: len(responses) >= 8, "version 1's first answers", timeout_s=30)
                    await asyncio.to_thread(copy_version, tiny_artifact, repository, "tiny", "2")

                await asyncio.gather(publish(), *(client_loop() for _ in range(4)))
            return responses

        responses = asyncio.run(hammer())
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
        versions = [r.json()["model_version"] for r in responses]
        assert "1" in versions and "2" in versions
        assert versions.index("2") > 0
        detail = httpx.get(f"{server.url}/models/tiny").json()
        assert detail["default_version"] == "2" and [v["version"] for v in detail["versions"]] == ["1", "2"]
        pinned = httpx.post(f"{server.url}/predict", json={"version": "1", "inputs": [{"pixels":
                                                                                       random_pixels(rng)[0]}]})
        assert pinned.json()["model_version"] == "1"
        shutil.rmtree(repository / "tiny" / "1")
        wait_for(lambda: len(httpx.get(f"{server.url}/models/tiny").json()["versions"]) == 1,
                 "the removed version to leave the list", timeout_s=10, poll_s=0.1)
        gone = httpx.post(f"{server.url}/predict", json={"version": "1", "inputs": [{"pixels":
                                                                                     random_pixels(rng)[0]}]})
        assert gone.status_code == 404


def test_loaded_versions_are_frozen_out_of_garbage_collection_until_shutdown(tiny_artifact: Path,
                                                                              tmp_path: Path) -> None:
    """Full collections would otherwise walk every model object on the event loop (service/engine/heap.py); a removed
    version, once drained, is still freed although it had been frozen."""
    repository = tmp_path / "repo"
    copy_version(tiny_artifact, repository, "tiny", "1")
    with serve(settings_for(repository, tmp_path, poll_interval_s=0.1)) as server:
        frozen_at_start = gc.get_freeze_count()
        assert frozen_at_start > 0
        first = server.app_state.repository.get("tiny", "1")
        assert first is not None and first.artifact is not None
        first_module = weakref.ref(first.artifact.module)
        first_worker = weakref.ref(first.worker)
        del first
        copy_version(tiny_artifact, repository, "tiny", "2")
        wait_for(lambda: httpx.get(f"{server.url}/models/tiny").json()["default_version"] == "2",
                   "version 2 ready")
        wait_for(lambda: gc.get_freeze_count() > frozen_at_start, "version 2 frozen", timeout_s=10)
        body = {"inputs": [{"pixels": random_pixels(np.random.default_rng(2))[0]}], "n_samples": 2}
        assert httpx.post(f"{server.url}/predict", json=body, timeout=30).json()["model_version"] == "2"
        shutil.rmtree(repository / "tiny" / "1")
        wait_for(lambda: first_module() is None and first_worker() is None, "version 1 freed after its removal",
                   timeout_s=30)
    assert gc.get_freeze_count() == 0


def series(server_url: str, name: str, **labels: str) -> float | None:
    return metric_value(httpx.get(f"{server_url}/metrics").text, name, **labels)


def test_reference_and_capacity_series_follow_the_repository(tiny_artifact: Path, tmp_path: Path) -> None:
    """A ready version exports its manifest's reference values and its queue capacity, and its counters at 0;
    a version that is removed takes its series with it; one whose reload fails keeps serving, and its series."""
    repository = tmp_path / "repo"
    copy_version(tiny_artifact, repository, "tiny", "1")
    manifest = json.loads((tiny_artifact / "manifest.json").read_text())
    with serve(settings_for(repository, tmp_path, poll_interval_s=0.1, max_queue=7)) as server:
        text = httpx.get(f"{server.url}/metrics").text
        v1 = {"model": "tiny", "version": "1"}
        assert metric_value(text, "director_reference_accuracy_ratio", **v1) == manifest["reference"]["accuracy"]
        assert metric_value(text, "director_reference_ood_ratio", **v1) == manifest["reference"]["ood_rate"]
        assert metric_value(text, "director_reference_mutual_information_nats", **v1, quantile="0.5") is not None
        assert metric_value(text, "director_queue_capacity", **v1) == 7.0
        assert metric_value(text, "director_rejected_requests_total", **v1, reason="queue_full") == 0.0
        assert metric_value(text, "director_predictions_total", **v1) == 0.0  # no request yet

        copy_version(tiny_artifact, repository, "tiny", "2")
        wait_for(lambda: series(server.url, "director_queue_capacity", model="tiny", version="2") == 7.0,
                   "version 2's series")
        shutil.rmtree(repository / "tiny" / "1")
        wait_for(lambda: series(server.url, "director_queue_capacity", **v1) is None, "version 1's removal")
        text = httpx.get(f"{server.url}/metrics").text
        assert metric_value(text, "director_reference_accuracy_ratio", **v1) is None
        assert metric_value(text, "director_reference_confidence_ratio", **v1, quantile="0.1") is None
        assert metric_value(text, "director_model_info", **v1) is None
        assert metric_value(text, "director_reference_accuracy_ratio", model="tiny", version="2") is not None

        # version 2 replaced in place by a folder that cannot load: it keeps serving its earlier files, so its series
        # stay, and /models says why it did not change
        (repository / "tiny" / "2" / "manifest.json").write_text(json.dumps({**manifest, "format_version": "9.0"}))
        wait_for(lambda: any(v["reload_error"] for v in httpx.get(f"{server.url}/models/tiny").json()["versions"]),
                   "version 2's failed reload")
        text = httpx.get(f"{server.url}/metrics").text
        assert metric_value(text, "director_reference_accuracy_ratio", model="tiny", version="2") is not None
        assert metric_value(text, "director_queue_capacity", model="tiny", version="2") == 7.0
        assert metric_value(text, "director_model_info", model="tiny", version="2", state="unavailable") is None
