"""An open ``/metrics`` flood against ``/feedback`` and ``/predict``, with the feedback store nearly full of labels.

``python -m benchmarks.metrics_flood [--seconds 20] [--rows 100 100000] [--baseline-root PATH]``: serves the committed
repository (torch pinned to one thread) with its SQLite feedback store pre-filled with ``rows`` labelled predictions
of the default model's default version (coverage 0.9 and max_risk 0.1 asked, ten feedback clients), and for
``--seconds`` per phase runs one client that sends a one-image ``/predict`` and then labels it on ``/feedback``, back
to back:

- ``quiet``: nothing else runs;
- ``probe_flood``: the same eight clients read ``/health/live`` instead: what any request flood as fast costs this
  machine (the reference a ``/metrics`` flood is judged against once a scrape costs no more than a probe);
- ``flood``: eight scrapers read ``/metrics`` back to back from a process of their own, at ``--scraper-nice``
  (default 19, as benchmarks/faults.py runs its background clients: on a deployment the scrapers are other machines;
  here they share the server's two cores, and what is measured is the server's answer to them, not the CPU the
  load generator takes from it; ``--scraper-nice 0`` shows both).

Reported per store size: the predict and feedback latencies (p50, p99) and status codes of both phases, the scrapes'
latency, and the ratios the fourth attack set as targets: no ``/feedback`` 503 and ``/predict`` p99 within 2x of quiet
under the flood, and a scrape costing the same at 100 labelled rows and at 100,000. ``--baseline-root`` runs the same
against another checkout (the commit before the live gauges moved off the scrape path) for a before/after.

Writes the JSON to ``--out`` and the table to docs/benchmarks-metrics-flood.md."""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.faults import BackgroundLoad, Probe, image_body
from benchmarks.server import ROOT, running_server
from benchmarks.stalled_clients import summary

MODEL = "fashion-vit"
SCRAPERS = 8
COLUMNS = ("request_id, idx, model, version, n_samples, class_index, label, confidence, created, correct, feedback_at, "
           "coverage, prediction_set, max_risk, abstain, covered, feedback_client")


def fill_store(database: Path, version: str, rows: int, seed: int = 0) -> None:
    """``rows`` labelled predictions written as the server's store writes them (its schema, created by the server)."""
    rng = np.random.default_rng(seed)
    now = time.time()
    correct = rng.random(rows) < 0.9
    values = [(f"fill{n // 100}", n % 100, MODEL, version, 1, 0, "T-shirt/top", float(0.5 + 0.5 * rng.random()),
               now - rows + n, int(correct[n]), now - rows + n, 0.9, b"\x01", 0.1, 0, int(rng.random() < 0.9),
               f"key:labeller{n % 10}") for n in range(rows)]
    with sqlite3.connect(database, timeout=60) as conn:
        known = {row[1] for row in conn.execute("PRAGMA table_info(predictions)")}
        columns = [name.strip() for name in COLUMNS.split(",")]
        kept = [i for i, name in enumerate(columns) if name in known]  # a baseline's store may predate a column
        conn.executemany(f"INSERT INTO predictions ({', '.join(columns[i] for i in kept)}) VALUES "
                         f"({', '.join('?' * len(kept))})", [tuple(row[i] for i in kept) for row in values])


class PredictThenLabel:
    """One client, back to back: a one-image prediction, then its true label."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.predict: list[float] = []
        self.feedback: list[float] = []
        self.codes: dict[str, dict[str, int]] = {"predict": {}, "feedback": {}}
        self._stop = threading.Event()

    def run(self, seconds: float) -> dict[str, Any]:
        body = image_body(0)
        deadline = time.monotonic() + seconds
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while time.monotonic() < deadline:
                predicted = self._timed(client, "predict", self.predict, json=body)
                if predicted is None or predicted.status_code != 200:
                    continue
                label = {"id": predicted.json()["id"], "index": 0, "label": predicted.json()["predictions"][0]["label"]}
                self._timed(client, "feedback", self.feedback, json=label)
        return {"predict": {**summary(self.predict), "codes": self.codes["predict"]},
                "feedback": {**summary(self.feedback), "codes": self.codes["feedback"]}}

    def _timed(self, client: httpx.Client, route: str, latencies: list[float], **request: Any) -> httpx.Response | None:
        start = time.perf_counter()
        try:
            response = client.post(f"/{route}", **request)
            code = str(response.status_code)
        except httpx.HTTPError as exc:
            response, code = None, type(exc).__name__
        latencies.append(time.perf_counter() - start)
        self.codes[route][code] = self.codes[route].get(code, 0) + 1
        return response


def default_version(url: str) -> str:
    return str(httpx.get(f"{url}/models/{MODEL}", timeout=30).json()["default_version"])


def run_size(root: Path, repository: Path, rows: int, seconds: float, nice: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="director-flood-") as tmp:
        database = Path(tmp) / "feedback.sqlite3"
        extra = ["--feedback-db", str(database), "--feedback-max-rows", str(max(100_000, 2 * rows))]
        with running_server(repository, MODEL, 1, extra, root=root) as url:
            fill_store(database, default_version(url), rows)
            httpx.get(f"{url}/metrics", timeout=60)  # the first read of the filled store is not measured
            body_bytes = len(httpx.get(f"{url}/metrics", timeout=60).content)
            quiet = PredictThenLabel(url).run(seconds)
            probe_flood, _ = flooded(url, "/health/live", seconds, nice)
            flood, scrapes = flooded(url, "/metrics", seconds, nice)
    latencies = list(scrapes)
    return {"rows": rows, "quiet": quiet, "probe_flood": probe_flood, "flood": flood, "metrics_body_bytes": body_bytes,
            "scrapes": {"requests": sum(int(p["requests"]) for p in latencies),
                        "p50_ms": float(np.median([p["p50_ms"] for p in latencies])),
                        "p99_ms": float(max(p["p99_ms"] for p in latencies)),
                        "codes": merged([p["codes"] for p in latencies])}}


def flooded(url: str, path: str, seconds: float, nice: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Predict-then-label while ``SCRAPERS`` clients GET ``path`` back to back at CPU priority ``nice``."""
    load = BackgroundLoad([Probe(lambda c: c.get(path), url) for _ in range(SCRAPERS)])
    load.nice = nice
    with load:
        time.sleep(1.0)  # the flood is under way
        measured = PredictThenLabel(url).run(seconds)
    return measured, load.reports()


def merged(counts: list[Any]) -> dict[str, int]:
    total: dict[str, int] = {}
    for count in counts:
        for code, n in count.items():
            total[code] = total.get(code, 0) + int(n)
    return total


def verdicts(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets on the largest store, and the scrape's cost across store sizes."""
    largest = max(sizes, key=lambda size: size["rows"])
    smallest = min(sizes, key=lambda size: size["rows"])
    flood, quiet = largest["flood"], largest["quiet"]
    return {"feedback_503_under_flood": flood["feedback"]["codes"].get("503", 0),
            "predict_p99_flood_over_quiet": round(flood["predict"]["p99_ms"] / quiet["predict"]["p99_ms"], 2),
            "predict_p99_probe_flood_over_quiet": round(largest["probe_flood"]["predict"]["p99_ms"]
                                                        / quiet["predict"]["p99_ms"], 2),
            "scrape_p50_largest_over_smallest": round(largest["scrapes"]["p50_ms"] / smallest["scrapes"]["p50_ms"],
                                                      2)}


def table(name: str, result: dict[str, Any]) -> list[str]:
    lines = [f"### {name}", "", "| labelled rows | phase | predict p50 / p99 ms | feedback p50 / p99 ms | "
             "feedback codes | scrapes (p50 / p99 ms) |", "| ---: | --- | ---: | ---: | --- | --- |"]
    for size in result["sizes"]:
        for phase in ("quiet", "probe_flood", "flood"):
            run = size[phase]
            scrapes = size["scrapes"]
            scraped = (f"{scrapes['requests']:,} ({scrapes['p50_ms']:.1f} / {scrapes['p99_ms']:.1f})"
                       if phase == "flood" else "none")
            predict, feedback = run["predict"], run["feedback"]
            lines.append(f"| {size['rows']:,} | {phase} | {predict['p50_ms']:.1f} / {predict['p99_ms']:.1f} | "
                         f"{feedback['p50_ms']:.1f} / {feedback['p99_ms']:.1f} | {json.dumps(feedback['codes'])} | "
                         f"{scraped} |")
    v = result["verdicts"]
    lines += ["", f"- `/feedback` 503s under the flood at the largest store: {v['feedback_503_under_flood']} "
              "(target 0)",
              f"- `/predict` p99 under the flood over quiet: {v['predict_p99_flood_over_quiet']}x (target 2x or less); "
              f"under a `/health/live` flood as fast, for reference: {v['predict_p99_probe_flood_over_quiet']}x",
              f"- a scrape's p50 at the largest store over the smallest: {v['scrape_p50_largest_over_smallest']}x "
              "(target: about 1)", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rows", type=int, nargs="+", default=[100, 100_000])
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--scraper-nice", type=int, default=19, help="the scrapers' CPU priority (0: as the server)")
    parser.add_argument("--baseline-root", type=Path, default=None, help="a checkout to run the same against")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-metrics-flood.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "benchmarks-metrics-flood.md")
    args = parser.parse_args(argv)
    roots = {"this tree": ROOT, **({"baseline": args.baseline_root} if args.baseline_root else {})}
    results: dict[str, Any] = {"seconds": args.seconds, "scrapers": SCRAPERS, "scraper_nice": args.scraper_nice,
                               "torch_threads": 1}
    for name, root in roots.items():
        sizes = [run_size(root, args.repository, rows, args.seconds, args.scraper_nice) for rows in args.rows]
        results[name] = {"root": str(root), "sizes": sizes, "verdicts": verdicts(sizes)}
        print(json.dumps({name: results[name]["verdicts"]}), flush=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    lines = ["# An open /metrics flood against /feedback and /predict", "",
             f"Generated by `python -m benchmarks.metrics_flood --seconds {args.seconds:g} "
             f"--scraper-nice {args.scraper_nice}"
             + (" --baseline-root <checkout>" if args.baseline_root else "") + "` "
             f"(`{args.out.name}`): the committed repository served with torch pinned to one thread on this machine's "
             f"two cores, its feedback store pre-filled with labelled rows; one client predicts one image and labels "
             f"it, back to back, for {args.seconds:g} s alone (quiet) and while {SCRAPERS} scrapers read `/metrics` "
             f"back to back from a process of their own at nice {args.scraper_nice} (flood; 19: the server's answer "
             "to them, not the CPU the load generator takes from the same two cores). A `/metrics` body is "
             f"{results['this tree']['sizes'][-1]['metrics_body_bytes']:,} bytes here.", ""]
    for name in roots:
        lines += table(name, results[name])
    args.markdown.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
