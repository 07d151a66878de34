"""Two workers under load, as real processes: one killed (the others answer, a replacement takes connections only
once its model is loaded: no request is answered 503 or 5xx), and a drain (every request sent gets an answer: 200
during the grace, then the connection is refused at once, never left hanging in a socket nobody accepts on)."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

from tests.service.conftest import random_pixels, wait_for
from tests.service.test_process import service_process
from tests.service.test_workers import answered_by_worker

CLIENTS = 3
BODY = {"inputs": [{"pixels": random_pixels(np.random.default_rng(0))[0]}], "n_samples": 2}


class Load:
    """``CLIENTS`` threads sending /predict back to back, each on a fresh connection (so both workers get them),
    counting outcomes: the status code, ``refused`` (the connection was refused: nothing was sent) or ``unanswered``
    (sent, and the connection closed or timed out without a response)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.outcomes: Counter[str] = Counter()
        self.stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                outcome = str(httpx.post(f"{self.url}/predict", json=BODY, timeout=10).status_code)
            except httpx.ConnectError:
                outcome = "refused"
                self.stop.wait(0.05)  # a pause before the next try, cut short when the test is over
            except httpx.TransportError:
                outcome = "unanswered"
            self.outcomes[outcome] += 1

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def children(pid: int) -> set[int]:
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def worker_args(grace_s: int) -> list[str]:
    return ["--default-model", "tiny", "--workers", "2", "--shutdown-grace-s", str(grace_s), "--poll-interval-s", "0",
            "--log-level", "warning"]


def test_a_killed_worker_is_replaced_and_no_request_gets_an_error(tiny_repository: Path, tmp_path: Path) -> None:
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    env = {"DIRECTOR_FEEDBACK_DB": str(tmp_path / "f.sqlite3"), "DIRECTOR_TORCH_THREADS": "1",
           "PROMETHEUS_MULTIPROC_DIR": str(prom_dir)}
    with service_process(["--model-repository", str(tiny_repository), *worker_args(0)], env) as (proc, url):
        with Load(url) as load:
            wait_for(lambda: len(answered_by_worker(prom_dir, "/predict")) >= 2, "both workers to take connections",
                     poll_s=0.1)
            victim = int(next(iter(answered_by_worker(prom_dir, "/predict"))))
            before = children(proc.pid)
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: children(proc.pid) - before, "a replacement worker", poll_s=0.1)
            replacement = str(next(iter(children(proc.pid) - before)))
            wait_for(lambda: answered_by_worker(prom_dir, "/predict")[replacement] >= 5,  # it serves, once loaded
                     "the replacement to serve", poll_s=0.1)
        outcomes = load.outcomes
    assert set(outcomes) <= {"200", "unanswered"}, outcomes  # no 503 from a worker still loading, no 5xx
    assert outcomes["unanswered"] <= CLIENTS  # only requests the killed worker had taken
    assert outcomes["200"] >= 20


def test_a_drain_under_load_with_two_workers_answers_every_request(tiny_repository: Path, tmp_path: Path) -> None:
    env = {"DIRECTOR_FEEDBACK_DB": str(tmp_path / "f.sqlite3"), "DIRECTOR_TORCH_THREADS": "1"}
    with service_process(["--model-repository", str(tiny_repository), *worker_args(2)], env) as (proc, url):
        with Load(url) as load:
            wait_for(lambda: load.outcomes["200"] >= 2 * CLIENTS, "the load to flow through both workers' queues")
            before_term = sum(load.outcomes.values())
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
            after_exit = load.outcomes["refused"]
            wait_for(lambda: load.outcomes["refused"] >= after_exit + CLIENTS,  # each client tries once more
                     "each client to be refused once more", timeout_s=10, poll_s=0.05)
        outcomes = load.outcomes
    assert outcomes["unanswered"] == 0, outcomes  # none left hanging in the socket's backlog, none reset
    assert set(outcomes) <= {"200", "503", "refused"}, outcomes
    assert outcomes["200"] > before_term  # served through the grace too
