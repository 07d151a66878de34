"""``python -m service`` as a real process (uvicorn[standard]: uvloop and httptools): --help, graceful shutdown
on SIGTERM, several workers with multiprocess metrics."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
from pydantic import SecretStr

from service.config import Settings
from tests.service.conftest import REPO_ROOT, copy_version, metric_value, random_pixels, wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def service_process(args: list[str], env: dict[str, str]) -> Iterator[tuple[subprocess.Popen, str]]:
    port = free_port()
    cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port), *args]
    # its own process group: a failed test must not leave uvicorn's worker processes holding the pipe open
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        with contextlib.suppress(httpx.TransportError):
            return httpx.get(f"{url}/health/ready", timeout=2).status_code == 200
        return False

    try:
        wait_for(ready, "the service to become ready", timeout_s=180, poll_s=0.1)
        yield proc, url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the server and any worker it spawned
        proc.wait(timeout=30)


def post_when_every_worker_is_ready(url: str, body: dict, attempts: int = 150) -> httpx.Response:
    """/health/ready answered by one worker says nothing of the other, which may still be loading and answers
    503 + Retry-After (by design): retry those, bounded, on fresh connections."""
    answers: list[httpx.Response] = []

    def answered() -> bool:
        answers.append(httpx.post(url, json=body, timeout=30))
        return answers[-1].status_code != 503 or len(answers) == attempts

    wait_for(answered, "an answer from a worker that has loaded", timeout_s=180, poll_s=0.2)
    return answers[-1]


def test_help_lists_every_setting() -> None:
    result = subprocess.run([sys.executable, "-m", "service", "--help"], capture_output=True, text=True,
                            cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 0
    flags = {token.strip("[],") for token in result.stdout.split() if token.strip("[").startswith("--")}
    for name, field in Settings.model_fields.items():
        assert "DIRECTOR_" + name.upper() in result.stdout, name
        secret = field.annotation in (SecretStr | None, dict[str, SecretStr])  # a key, or named keys
        assert ("--" + name.replace("_", "-") in flags) is not secret, name  # secrets: environment only


def test_flags_override_the_environment(monkeypatch) -> None:  # noqa: ANN001 - pytest fixture
    from service.cli import settings_from_args

    monkeypatch.setenv("DIRECTOR_PORT", "9999")
    monkeypatch.setenv("DIRECTOR_MAX_QUEUE", "7")
    monkeypatch.setenv("DIRECTOR_REQUIRED_MODELS", "a,b")
    settings = settings_from_args(["--port", "8123", "--bf16"])
    assert settings.port == 8123 and settings.max_queue == 7 and settings.bf16 is True
    assert settings.required_models == ["a", "b"]


def test_sigterm_drains_then_exits(tiny_repository: Path, tmp_path: Path) -> None:
    env = {"DIRECTOR_FEEDBACK_DB": str(tmp_path / "f.sqlite3"), "DIRECTOR_TORCH_THREADS": "1"}
    # a request timeout far above what the six requests need on a busy machine: neither admission by measured work
    # (which refuses what the timeout cannot finish) nor the drain may cut them; a grace long enough for a readiness
    # probe to be answered while both cores are busy
    args = ["--model-repository", str(tiny_repository), "--default-model", "tiny", "--shutdown-grace-s", "5",
            "--request-timeout-s", "300", "--max-batch-samples", "8", "--max-request-batches", "32",
            "--poll-interval-s", "0", "--log-level", "info"]
    body = {"inputs": [{"pixels": p} for p in random_pixels(np.random.default_rng(0), 16)], "n_samples": 8}
    with service_process(args, env) as (proc, url):

        def admitted() -> float:
            """Requests the server has taken: queued or running (the queue's depth, set on each change) plus
            answered; it reaches 6 only once all six are in."""
            text = httpx.get(f"{url}/metrics", timeout=30).text
            waiting = metric_value(text, "director_queue_depth", model="tiny", version="1") or 0.0
            return waiting + (metric_value(text, "director_requests_total", endpoint="/predict", code="200") or 0.0)

        ready_statuses: list[int] = []  # still listening during the grace period, readiness turned first

        def turned() -> bool:
            ready_statuses.append(httpx.get(f"{url}/health/ready", timeout=30).status_code)
            return ready_statuses[-1] == 503

        with ThreadPoolExecutor(6) as pool:
            in_flight = [pool.submit(httpx.post, f"{url}/predict", json=body, timeout=300) for _ in range(6)]
            wait_for(lambda: admitted() >= 6, "all six requests in the server", poll_s=0.02)
            proc.send_signal(signal.SIGTERM)
            wait_for(turned, "readiness to turn 503", poll_s=0.02)
            responses = [future.result() for future in in_flight]
        assert set(ready_statuses) <= {200, 503} and ready_statuses[-1] == 503
        assert [r.status_code for r in responses] == [200] * 6
        # uvicorn re-raises the captured SIGTERM after its graceful shutdown (exit status 143 in a shell)
        assert proc.wait(timeout=300) in (0, -signal.SIGTERM)
        log = proc.stdout.read() if proc.stdout else ""
        assert "draining" in log and "Application shutdown complete" in log


def wait_for_metrics(url: str, condition: Callable[[str], bool], what: str, deadline_s: float = 120.0) -> str:
    scraped: list[str] = []

    def holds() -> bool:
        scraped.append(httpx.get(f"{url}/metrics", timeout=30).text)
        return condition(scraped[-1])

    wait_for(holds, what, timeout_s=deadline_s, poll_s=0.1)
    return scraped[-1]


def test_two_workers_give_whole_totals_in_multiprocess_mode(tiny_artifact: Path, tmp_path: Path) -> None:
    """Counters add up over the workers; per-version gauges (reference values, queue capacity, model state) come
    out once per version, without a pid label, and go when the version is removed, although prometheus-client
    cannot delete from its shared files."""
    repository = tmp_path / "repo"
    copy_version(tiny_artifact, repository, "tiny", "1")
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    env = {"DIRECTOR_FEEDBACK_DB": str(tmp_path / "f.sqlite3"), "DIRECTOR_TORCH_THREADS": "1",
           "PROMETHEUS_MULTIPROC_DIR": str(prom_dir)}
    args = ["--model-repository", str(repository), "--default-model", "tiny", "--workers", "2",
            "--poll-interval-s", "0.2", "--max-queue", "5", "--log-level", "warning"]
    v1, v2 = {"model": "tiny", "version": "1"}, {"model": "tiny", "version": "2"}
    with service_process(args, env) as (proc, url):
        with httpx.Client(base_url=url, timeout=30) as client:
            for seed in range(10):  # a fresh connection each time spreads requests over the workers
                body = {"inputs": [{"pixels": p} for p in random_pixels(np.random.default_rng(seed), 2)],
                        "version": "1"}
                assert post_when_every_worker_is_ready(f"{url}/predict", body).status_code == 200
            text = client.get("/metrics").text
        assert metric_value(text, "director_predictions_total", **v1) == 20.0
        assert metric_value(text, "director_requests_total", endpoint="/predict", code="200") == 10.0
        assert len(list(prom_dir.glob("counter_*.db"))) >= 2  # both workers wrote their share
        # capacity is summed like queue depth (each worker has its own queue of 5) once both workers loaded
        text = wait_for_metrics(url, lambda t: metric_value(t, "director_queue_capacity", **v1) == 10.0,
                                "both workers' queue capacity")
        reference = [line for line in text.splitlines() if line.startswith("director_reference_accuracy_ratio{")]
        assert len(reference) == 1 and "pid=" not in reference[0], reference  # one series, whatever the workers
        assert metric_value(text, "director_model_info", **v1, state="ready") == 1.0
        assert metric_value(text, "director_model_info", **v1, state="loading") is None  # not left over

        copy_version(tiny_artifact, repository, "tiny", "2")
        wait_for_metrics(url, lambda t: metric_value(t, "director_queue_capacity", **v2) == 10.0,
                         "version 2 in both workers")
        shutil.rmtree(repository / "tiny" / "1")
        removed = ("director_model_info", "director_reference_accuracy_ratio", "director_reference_ood_ratio",
                   "director_queue_capacity")  # each worker drops its series one by one: wait for all of them
        text = wait_for_metrics(url, lambda t: all(metric_value(t, name, **v1) is None for name in removed),
                                "version 1's removal in both workers")
        for name in removed[1:]:
            assert metric_value(text, name, **v1) is None, name
            assert metric_value(text, name, **v2) is not None, name
        assert "NaN" not in text  # removed series are left out, not exported as NaN
        assert metric_value(text, "director_predictions_total", **v1) == 20.0  # counters are history
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
