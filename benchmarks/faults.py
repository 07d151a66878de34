"""``/predict`` on one model while another model's work or the feedback store misbehaves, and ``/health/live`` during a
header flood, each against an unloaded baseline measured in the same run.

``python -m benchmarks.faults [--seconds 20]``: serves the committed repository (torch pinned to one thread, default
settings otherwise) and, for ``--seconds`` per scenario, sends sequential one-image predictions to ``fashion-vit`` and
probes ``/health/live`` every 50 ms (the background clients run in a process of their own) while:

- ``unloaded``: nothing else runs;
- ``costly_request``: a second client sends the costliest text requests the server accepts to
  ``movie-reviews-minilm``, back to back (it first sends 256 texts of 1,000 characters at ``n_samples`` 64 and
  records the answer: the per-request cost bound refuses it);
- ``store_healthy``: five clients send ``/feedback`` (``--feedback-rate`` labels a second together, default 100,
  whatever the answers: a refusal does not make them send faster or slower; 0 sends each back to back) and one
  scrapes ``/metrics`` every second, the store working (what those clients cost by themselves);
- ``store_locked``: the same clients while another process holds the SQLite feedback file in an exclusive
  transaction;
- ``store_full``: the same senders while the file system holding the store (a 64 MiB tmpfs the benchmark mounts;
  needs root) is full; afterwards the space returns and one ``/feedback`` must succeed again. (A read-only store is
  not staged here: Linux refuses to remount read-only a file system with the server's database open for writing,
  and root ignores file modes; the store's tests stage SQLite's read-only error with ``query_only``.)
- ``unloaded_one_slot`` and ``costly_request_one_slot``: the first two again on a server started with
  ``--concurrent-forwards 1`` (one forward at a time on the device, as before the forward gate had slots);
- ``header_flood``: eight connections stream request headers of 1,000 bytes every 20 ms until the server refuses
  them (431 at ``DIRECTOR_MAX_HEADER_BYTES``), and reconnect.

The background clients' process runs at ``--background-nice`` (default 19, the lowest CPU priority): on a
deployment they are other machines, here they share the server's cores, and what is measured is the server's answer
to their requests, not the CPU the load generator itself takes from it (``--background-nice 0`` shows both).
``--scenarios`` runs a subset (``unloaded`` always runs: the ratios are to it).

Prints one JSON object and writes it to ``--out``; the figures go to docs/benchmarks.md ("Faults").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np

from benchmarks.server import ROOT, running_server
from benchmarks.stalled_clients import summary

IMAGE_MODEL, TEXT_MODEL = "fashion-vit", "movie-reviews-minilm"
COSTLY = [(256, 64), (64, 16), (32, 8), (16, 8), (8, 4)]  # (texts of 1,000 characters, n_samples), costliest first
FEEDBACK_RATE = 100.0  # labels a second from the five senders together (0: back to back)
STORE_SIZE = "64m"  # room for the prediction log of a whole run; filled on purpose for store_full


class Probe:
    """Sequential requests in a thread until stopped: latencies and status codes. Each request starts ``period_s``
    after the one before began (at once if that one took longer), then waits ``pause_s`` more."""

    def __init__(self, send: Callable[[httpx.Client], httpx.Response], url: str, pause_s: float = 0.0,
                 period_s: float = 0.0) -> None:
        self.send, self.url, self.pause_s, self.period_s = send, url, pause_s, period_s
        self.latencies: list[float] = []
        self.codes: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                start = time.perf_counter()
                try:
                    code = str(self.send(client).status_code)
                except httpx.HTTPError as exc:
                    code = type(exc).__name__
                took = time.perf_counter() - start
                self.latencies.append(took)
                self.codes[code] += 1
                self._stop.wait(self.pause_s + max(0.0, self.period_s - took))

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def report(self) -> dict[str, object]:
        slowest = round(max(self.latencies, default=0.0) * 1000, 2)  # a stall, which a p99 can hide
        return {**summary(self.latencies), "max_ms": slowest, "codes": dict(self.codes),
                "server_errors": sum(n for code, n in self.codes.items() if code.startswith("5") and code != "503")}


def image_body(seed: int) -> dict:
    pixels = np.random.default_rng(seed).random((1, 28, 28)).round(4).tolist()
    return {"model": IMAGE_MODEL, "inputs": [{"pixels": pixels}], "n_samples": 1}


def text_body(texts: int, n_samples: int) -> dict:
    text = ("a long and winding review of a film that goes on " * 20)[:1000]
    return {"model": TEXT_MODEL, "inputs": [{"text": text}] * texts, "n_samples": n_samples}


def costliest_accepted(url: str) -> tuple[dict, dict[str, int]]:
    """The costliest of ``COSTLY`` the server accepts, and the answer to each one tried before it."""
    tried: dict[str, int] = {}
    with httpx.Client(base_url=url, timeout=600) as client:
        for texts, n_samples in COSTLY:
            code = client.post("/predict", json=text_body(texts, n_samples)).status_code
            tried[f"{texts} texts x S={n_samples}"] = code
            if code == 200:
                return text_body(texts, n_samples), tried
    raise RuntimeError(f"no costly request was accepted: {tried}")


class BackgroundLoad:
    """``probes`` run in a child process of their own (forked), so that their threads never hold the interpreter
    lock the measuring probes need, at CPU priority ``nice``: the latencies measured are the server's, not the load
    generator's."""

    nice = 19

    def __init__(self, probes: list[Probe]) -> None:
        self.probes = probes
        context = multiprocessing.get_context("fork")
        self._stop, self._reports = context.Event(), context.Queue()
        self._process = context.Process(target=self._run, daemon=True)

    def _run(self) -> None:
        os.nice(self.nice)
        with contextlib.ExitStack() as stack:
            for probe in self.probes:
                stack.enter_context(probe)
            self._stop.wait()
        self._reports.put([probe.report() for probe in self.probes])

    def __enter__(self) -> BackgroundLoad:
        self._process.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()

    def reports(self) -> list[dict[str, object]]:
        reports = self._reports.get(timeout=300) if self.probes else []
        self._process.join(timeout=60)
        return reports


def measure(url: str, seconds: float, seed: int, *background: Probe) -> dict[str, object]:
    """The image model's /predict and /health/live for ``seconds`` while ``background`` probes run."""
    body = image_body(seed)
    load = BackgroundLoad(list(background))
    with load:
        time.sleep(1.0)  # the background load is under way
        with Probe(lambda c: c.post("/predict", json=body), url) as predict, \
                Probe(lambda c: c.get("/health/live"), url, pause_s=0.05) as live:
            time.sleep(seconds)
    return {"predict": predict.report(), "live": live.report(), "background": load.reports()}


def store_clients(url: str, request_id: str, rate: float) -> list[Probe]:
    """Five /feedback senders, together ``rate`` labels a second (0: each back to back), and a /metrics scraper
    (every second, as Prometheus would)."""
    label = {"id": request_id, "index": 0, "label": 1}
    period_s = 5 / rate if rate > 0 else 0.0
    senders = [Probe(lambda c: c.post("/feedback", json=label), url, period_s=period_s) for _ in range(5)]
    return [*senders, Probe(lambda c: c.get("/metrics"), url, pause_s=1.0)]


@contextlib.contextmanager
def header_flood(url: str, connections: int = 8) -> Iterator[Counter[str]]:
    """``connections`` threads streaming 1,000-byte header lines every 20 ms, reconnecting when refused."""
    parts = urlsplit(url)
    stop = threading.Event()
    outcomes: Counter[str] = Counter()

    def flood(index: int) -> None:
        while not stop.is_set():
            with socket.create_connection((parts.hostname, parts.port)) as sock:
                sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n")
                line = f"X-Filler-{index}: ".encode() + b"a" * 1000 + b"\r\n"
                try:
                    while not stop.is_set():
                        sock.sendall(line)
                        stop.wait(0.02)
                except OSError:  # the server refused the headers and closed the connection
                    pass
                with contextlib.suppress(OSError):
                    sock.settimeout(1.0)
                    answer = sock.recv(64)
                    outcomes[answer.split(b" ")[1].decode() if answer.count(b" ") else "closed"] += 1

    threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(connections)]
    for thread in threads:
        thread.start()
    try:
        yield outcomes
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)


@contextlib.contextmanager
def small_file_system(folder: Path) -> Iterator[Path | None]:
    """A tmpfs of ``STORE_SIZE`` mounted at ``folder`` (None without root: those scenarios are left out)."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        yield None
        return
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STORE_SIZE}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Write a file until the file system is full (it may be full already: the store itself can fill it); returns
    it (delete it to give the space back)."""
    filler = folder / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as handle:
        while True:
            handle.write(b"\0" * 65536)
            handle.flush()
    return filler


def recovered(url: str, request_id: str, within_s: float = 30.0) -> bool:
    """Whether /feedback answers 200 again within ``within_s`` once the fault is gone."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        answer = httpx.post(f"{url}/feedback", json={"id": request_id, "index": 0, "label": 1}, timeout=30)
        if answer.status_code == 200:
            return True
        time.sleep(0.5)
    return False


SCENARIOS = ("costly_request", "store_healthy", "store_locked", "store_full", "header_flood", "one_slot")


def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    wanted = set(args.scenarios)
    results: dict[str, object] = {}
    costly: dict | None = None
    with small_file_system(work / "store") as store:
        database = (store or work) / "feedback.sqlite3"
        with running_server(args.repository, IMAGE_MODEL, 1, ["--feedback-db", str(database)]) as url:
            request_id = httpx.post(f"{url}/predict", json=image_body(0), timeout=60).json()["id"]
            results["unloaded"] = measure(url, args.seconds, 1)
            if wanted & {"costly_request", "one_slot"}:
                costly, tried = costliest_accepted(url)
            if "costly_request" in wanted:
                results["costly_request"] = {**measure(url, args.seconds, 2, Probe(
                    lambda c: c.post("/predict", json=costly), url)), "tried": tried}
            results.update(store_faults(url, args.seconds, args.feedback_rate, request_id, wanted, database, store))
            if "header_flood" in wanted:
                with header_flood(url) as outcomes:
                    results["header_flood"] = measure(url, args.seconds, 6)
                results["header_flood"]["flood_answers"] = dict(outcomes)  # type: ignore[index]
        if costly is not None and "one_slot" in wanted:
            # the same costly request with one forward at a time on the device: what the forward gate's second slot
            # buys
            with running_server(args.repository, IMAGE_MODEL, 1, ["--feedback-db", str(work / "one-slot.sqlite3"),
                                                                   "--concurrent-forwards", "1"]) as url:
                results["unloaded_one_slot"] = measure(url, args.seconds, 8)
                results["costly_request_one_slot"] = measure(url, args.seconds, 9, Probe(
                    lambda c: c.post("/predict", json=costly), url))
    return results


def store_faults(url: str, seconds: float, rate: float, request_id: str, wanted: set[str], database: Path,
                 store: Path | None) -> dict[str, object]:
    """The store scenarios: the same clients with the store working, locked, and on a full file system."""
    results: dict[str, object] = {}
    if "store_healthy" in wanted:
        results["store_healthy"] = measure(url, seconds, 7, *store_clients(url, request_id, rate))
    if "store_locked" in wanted:
        with sqlite3.connect(database, timeout=1) as locker:
            locker.execute("BEGIN EXCLUSIVE")
            results["store_locked"] = measure(url, seconds, 3, *store_clients(url, request_id, rate))
            locker.rollback()
        results["store_locked"]["recovered"] = recovered(url, request_id)  # type: ignore[index]
    if "store_full" in wanted and store is None:
        results["store_full"] = "not run: needs root to mount a tmpfs"
    elif "store_full" in wanted:
        filler = fill(store)
        results["store_full"] = measure(url, seconds, 4, *store_clients(url, request_id, rate))
        filler.unlink(missing_ok=True)
        results["store_full"]["recovered"] = recovered(url, request_id)  # type: ignore[index]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-faults.json")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--background-nice", type=int, default=BackgroundLoad.nice,
                        help="CPU priority (nice) of the background clients' process")
    parser.add_argument("--feedback-rate", type=float, default=FEEDBACK_RATE,
                        help="labels a second the five /feedback senders offer together (0: each back to back)")
    args = parser.parse_args(argv)
    BackgroundLoad.nice = args.background_nice
    with tempfile.TemporaryDirectory(prefix="director-faults-") as tmp:
        results = run(args, Path(tmp))
    base = results["unloaded"]["predict"]["p99_ms"]  # type: ignore[index]
    for entry in results.values():
        if isinstance(entry, dict):
            entry["predict_p99_ratio"] = round(entry["predict"]["p99_ms"] / base, 2)
    command = " ".join(["python -m benchmarks.faults", *(argv if argv is not None else sys.argv[1:])])
    payload = {"command": command, "cpu_count": os.cpu_count(), "torch_threads": 1,
               "background_nice": args.background_nice, "feedback_rate": args.feedback_rate, "scenarios": results}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
