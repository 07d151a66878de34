"""``python -m service --workers 2`` as a real process: both workers serve one socket, metric totals add up to
the requests sent, the SQLite feedback file is shared (a label sent to either worker counts for both), and on
SIGTERM every worker drains through the shutdown grace as a single process does, then the parent exits 0."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.mmap_dict import MmapedDict

from tests.service.conftest import metric_value, random_pixels, wait_for
from tests.service.test_process import post_when_every_worker_is_ready, service_process


def answered_by_worker(prom_dir: Path, endpoint: str) -> Counter[str]:
    """Requests to ``endpoint`` each worker served (200), read from its own counter file (``counter_<pid>.db``). A
    worker still loading answers 503 and the client retries: those are counted by the server but not served."""
    answered: Counter[str] = Counter()
    for path in prom_dir.glob("counter_*.db"):
        for key, value, *_ in MmapedDict.read_all_values_from_file(str(path)):
            _, sample, labels, _ = json.loads(key)
            if (sample == "director_requests_total" and labels.get("endpoint") == endpoint
                    and labels.get("code") == "200"):
                answered[path.stem.removeprefix("counter_")] += int(value)
    return answered


def post_feedback(url: str, body: dict) -> httpx.Response:
    """The prediction's log reaches the shared file on its worker's next flush (every 0.1 s): retry 404, bounded."""
    responses: list[httpx.Response] = []
    wait_for(lambda: responses.append(httpx.post(f"{url}/feedback", json=body, timeout=30)) or
             responses[-1].status_code != 404, "the prediction's log in the shared file", poll_s=0.1)
    return responses[-1]


def test_two_workers_share_totals_and_feedback_and_drain_through_the_grace(tiny_repository: Path,
                                                                             tmp_path: Path) -> None:
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    env = {"DIRECTOR_FEEDBACK_DB": str(tmp_path / "f.sqlite3"), "DIRECTOR_TORCH_THREADS": "1",
           "PROMETHEUS_MULTIPROC_DIR": str(prom_dir)}
    args = ["--model-repository", str(tiny_repository), "--default-model", "tiny", "--workers", "2",
            "--shutdown-grace-s", "10", "--poll-interval-s", "0", "--log-level", "info"]
    with service_process(args, env) as (proc, url):
        # a prediction then a label for it, each on a fresh connection, until both workers answered both kinds
        sent, correct = 0, 0
        while len(answered_by_worker(prom_dir, "/predict")) < 2 or len(answered_by_worker(prom_dir, "/feedback")) < 2:
            assert sent < 100, "one worker answered everything"
            body = {"inputs": [{"pixels": random_pixels(np.random.default_rng(sent))[0]}], "n_samples": 2}
            predicted = post_when_every_worker_is_ready(f"{url}/predict", body)
            assert predicted.status_code == 200, predicted.text
            out = predicted.json()
            class_index = out["predictions"][0]["class_index"]
            right = sent % 2 == 0
            label = class_index if right else (class_index + 1) % len(out["predictions"][0]["probabilities"])
            sent, correct = sent + 1, correct + right
            feedback = post_feedback(url, {"id": out["id"], "index": 0, "label": label})
            assert feedback.status_code == 200, feedback.text
            # counted over every label either worker received: the store is one file
            answer = feedback.json()
            assert answer["labelled"] == sent and answer["live_accuracy"] == pytest.approx(correct / sent)

        text = httpx.get(f"{url}/metrics", timeout=30).text
        predictions = metric_value(text, "director_predictions_total", model="tiny", version="1")
        requests = metric_value(text, "director_requests_total", endpoint="/predict", code="200")
        labels = metric_value(text, "director_feedback_total", model="tiny", version="1")
        assert predictions == requests == labels == sent  # whole numbers: each request counted once
        assert sum(answered_by_worker(prom_dir, "/predict").values()) == sent
        live = metric_value(text, "director_live_accuracy_ratio", model="tiny", version="1")
        assert live == pytest.approx(correct / sent)
        pids = {line.split('pid="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("process_resident_memory_bytes{")}
        assert len(pids) == 2, pids

        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: httpx.get(f"{url}/health/ready", timeout=30).status_code == 503,  # readiness turns first
                 "readiness to turn 503", timeout_s=30, poll_s=0.05)
        during_grace = [httpx.post(f"{url}/predict", json=body, timeout=30) for _ in range(2)]
        assert [r.status_code for r in during_grace] == [200] * 2
        assert all(r.headers["connection"] == "close" for r in during_grace)
        assert proc.wait(timeout=60) == 0
        log = proc.stdout.read() if proc.stdout else ""
        assert log.count("draining: not ready for 10.0s") == 2, log  # each worker took the grace
        assert not list(prom_dir.glob("gauge_live*.db"))  # both workers' live gauges marked dead


def test_workers_exit_when_their_supervisor_is_killed(tiny_repository: Path, tmp_path: Path) -> None:
    """SIGKILL to the parent, which cannot pass anything on: its workers still get SIGTERM (the kernel's parent-death
    signal), drain and exit, so the port is free for the next server."""
    import os
    import socket
    from urllib.parse import urlsplit

    env = {"DIRECTOR_FEEDBACK_DB": str(tmp_path / "f.sqlite3"), "DIRECTOR_TORCH_THREADS": "1"}
    args = ["--model-repository", str(tiny_repository), "--default-model", "tiny", "--workers", "2",
            "--shutdown-grace-s", "0", "--poll-interval-s", "0"]
    with service_process(args, env) as (proc, url):
        workers = [int(pid) for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert len(workers) >= 2, workers  # the spawned workers (and multiprocessing's resource tracker)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

        def running(pid: int) -> bool:
            try:
                return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            except (FileNotFoundError, ProcessLookupError):
                return False

        wait_for(lambda: not any(running(pid) for pid in workers), "the workers to end with their supervisor",
                 poll_s=0.2)
        parts = urlsplit(url)
        with socket.socket() as probe:  # nobody listens any more
            assert probe.connect_ex((parts.hostname, parts.port)) != 0
