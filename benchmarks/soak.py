"""Soak test: mixed traffic against ``python -m service`` on loopback for ``--duration`` seconds, with a reload in
the middle (a new version copied into the served repository, picked up by polling).

Traffic, open loop at ``--rate`` requests/s (Poisson arrivals, latency from the scheduled arrival): base64 PNG
images, pixel arrays, texts, OIP pixel tensors, and feedback for earlier predictions. Reported: errors by status
code, p99 per minute, and the resident memory of the server process and its children sampled every
``--memory-every-s`` seconds; a JSON file and a PNG plot. The point is a trend: memory flat after warm-up and no
errors, through the reload.

    nice -n 10 python -m benchmarks.soak --duration 1800
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import random
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from benchmarks.server import ROOT, server_process

IMAGE_MODEL, TEXT_MODEL = "fashion-vit", "movie-reviews-minilm-deterministic"
MIX = {"image": 3, "pixels": 3, "text": 2, "oip": 2, "feedback": 2}  # relative weights
TEXTS = ["a tender, funny and wise film", "dull, overlong and badly acted", "not bad at all", "I wanted to leave"]


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (``/proc``): the supervisor and every worker."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:  # exited meanwhile
            continue
        total += next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))
        todo.extend(int(child) for child in children)
    return total


def png_base64(rng: np.random.Generator) -> str:
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


class Traffic:
    """The next request of each kind; remembers prediction ids for feedback."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.choice = random.Random(seed)
        self.predicted: list[tuple[str, int]] = []  # (request id, class index) not yet labelled

    def request(self, kind: str) -> tuple[str, dict[str, Any]]:
        pixels = self.rng.random((1, 28, 28)).round(4)
        if kind == "image":
            image = png_base64(self.rng)
            return "/predict", {"model": IMAGE_MODEL, "inputs": [{"image_base64": image}], "n_samples": 8}
        if kind == "pixels":
            return "/predict", {"model": IMAGE_MODEL, "inputs": [{"pixels": pixels.tolist()}], "n_samples": 8}
        if kind == "text":
            return "/predict", {"model": TEXT_MODEL, "inputs": [{"text": self.choice.choice(TEXTS)}]}
        if kind == "oip":
            tensor = {"name": "pixels", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": pixels.ravel().tolist()}
            return f"/v2/models/{IMAGE_MODEL}/infer", {"inputs": [tensor], "parameters": {"n_samples": 8}}
        request_id, class_index = self.predicted.pop(self.choice.randrange(len(self.predicted)))
        label = class_index if self.choice.random() < 0.8 else (class_index + 1) % 10
        return "/feedback", {"id": request_id, "index": 0, "label": label}

    def pick(self) -> str:
        kinds = [k for k in MIX if k != "feedback" or self.predicted]
        return self.choice.choices(kinds, weights=[MIX[k] for k in kinds])[0]


async def soak(url: str, pid: int, repository: Path, args: argparse.Namespace) -> dict[str, Any]:
    traffic = Traffic(args.seed)
    latencies: dict[int, list[float]] = defaultdict(list)  # minute -> seconds
    statuses: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    memory: list[tuple[float, int]] = []
    tasks: set[asyncio.Task] = set()
    reloaded_at: float | None = None
    start = time.monotonic()

    async def one(client: httpx.AsyncClient, kind: str, scheduled: float) -> None:
        path, body = traffic.request(kind)
        try:
            response = await client.post(path, json=body)
            status = str(response.status_code)
            if kind in ("image", "pixels") and response.status_code == 200:
                traffic.predicted.append((response.json()["id"], response.json()["predictions"][0]["class_index"]))
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        statuses[status] += 1
        by_kind[kind] += 1
        latencies[int((scheduled - start) // 60)].append(time.monotonic() - scheduled)

    async def sample_memory() -> None:
        while True:
            memory.append((time.monotonic() - start, rss_bytes(pid)))
            await asyncio.sleep(args.memory_every_s)

    sampler = asyncio.create_task(sample_memory())
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        scheduled = time.monotonic()
        while True:
            scheduled += traffic.choice.expovariate(args.rate)
            if scheduled - start >= args.duration:
                break
            await asyncio.sleep(max(0.0, scheduled - time.monotonic()))
            if reloaded_at is None and scheduled - start >= args.duration / 2:
                reloaded_at = scheduled - start
                await asyncio.to_thread(publish_version, repository, "2")
            task = asyncio.create_task(one(client, traffic.pick(), scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        models = (await client.get(f"/models/{IMAGE_MODEL}")).json()
    sampler.cancel()
    return {"duration_s": args.duration, "rate": args.rate, "requests": sum(statuses.values()),
            "statuses": dict(statuses), "by_kind": dict(by_kind), "reload_at_s": reloaded_at,
            "versions_after": {v.get("version"): v.get("state") for v in models.get("versions", [])},
            "p99_by_minute_s": {m: float(np.percentile(v, 99)) for m, v in sorted(latencies.items())},
            "memory": memory}


def publish_version(repository: Path, version: str) -> None:
    """A hidden copy renamed into place: polling never sees a half-copied version."""
    source = repository / IMAGE_MODEL / "1"
    staging = repository / IMAGE_MODEL / f".{version}.tmp"
    shutil.copytree(source, staging)
    staging.rename(repository / IMAGE_MODEL / version)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    minutes = [int(m) for m in result["p99_by_minute_s"]]
    top.plot([m + 0.5 for m in minutes], [v * 1000 for v in result["p99_by_minute_s"].values()], marker="o")
    top.set_ylabel("p99 latency (ms)")
    bottom.plot([t / 60 for t, _ in result["memory"]], [b / 2**20 for _, b in result["memory"]])
    bottom.set_ylabel("RSS, server + children (MiB)")
    bottom.set_xlabel("minutes")
    for axis in (top, bottom):
        if result["reload_at_s"] is not None:
            axis.axvline(result["reload_at_s"] / 60, color="grey", linestyle="--", label="reload")
        axis.grid(alpha=0.3)
    top.legend()
    fig.suptitle(f"soak: {result['requests']} requests, statuses {result['statuses']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def memory_growth(memory: list[tuple[float, int]], warmup_s: float) -> float | None:
    """Last sample over the first one after warm-up, minus 1."""
    after = [rss for t, rss in memory if t >= warmup_s]
    return after[-1] / after[0] - 1 if len(after) >= 2 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of traffic (default 1800)")
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second offered (default 4)")
    parser.add_argument("--threads", type=int, default=1, help="server torch threads (default 1)")
    parser.add_argument("--workers", type=int, default=1, help="server worker processes (default 1)")
    parser.add_argument("--memory-every-s", type=float, default=5.0)
    parser.add_argument("--warmup-s", type=float, default=60.0, help="memory growth is measured after this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="director-soak-") as tmp:
        repository = Path(tmp) / "repo"
        for model in (IMAGE_MODEL, TEXT_MODEL):
            shutil.copytree(ROOT / "model_repository" / model / "1", repository / model / "1")
        extra = ["--poll-interval-s", "2", "--workers", str(args.workers)]
        with server_process(repository, IMAGE_MODEL, args.threads, extra) as (proc, url):
            result = asyncio.run(soak(url, proc.pid, repository, args))
    result["memory_growth_after_warmup"] = memory_growth(result["memory"], args.warmup_s)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out / "soak.png")
    summary = {k: v for k, v in result.items() if k != "memory"}
    summary["rss_mib_first_last"] = [round(result["memory"][0][1] / 2**20), round(result["memory"][-1][1] / 2**20)]
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
