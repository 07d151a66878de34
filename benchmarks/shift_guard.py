"""Prediction sets and abstentions under shift, with the shift guard on and off, as a caller of the served model gets
them (docs/method.md, "When the guarantees hold").

``python -m benchmarks.shift_guard [--images 2000] [--batch 32]``: serves the committed repository's default image
model (torch pinned to one thread) and sends Fashion-MNIST test images in requests of ``--batch`` with ``coverage``
0.9 and ``max_risk`` 0.05, for each shift: none (in distribution), rotations by 90 and 180 degrees, and the Fashion-
MNIST-C corruptions contrast and gaussian noise at severities 3 and 5. Each request is sent twice: with the guard (the
defaults: a request whose inputs look shifted has every set widened and every input abstaining, and a flagged input
abstains) and without it (``widen_if_shifted`` and ``abstain_if_ood`` off: the calibrated sets and thresholds
alone). A fresh server serves each shift, so the live drift monitor starts empty; ``--single`` also sends one image
a request (where only the input's own flag and the live window can speak).

Reported per shift and mode: coverage and mean set size at 0.9, answered share and answered error at ``max_risk``
0.05, the OOD flag's share and the share of requests called shifted; and the guard's own cost per request against
the request's latency. None of the guard's constants was chosen on these shifts (a binomial test at 0.01, the
drift alert's KS 0.1). Writes ``--out`` and docs/benchmarks-shift-guard.md."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from benchmarks.server import ROOT, running_server
from service.engine.shift import check_shift
from training.data.corruptions import corrupt
from training.data.images import load_fashion_mnist_split

MODEL = "fashion-vit"
FASHION_ROOT = Path("/usr/share/datasets/fashion-mnist")
SHIFTS = [("none", None, 0), ("rotation 90", "rot90", 1), ("rotation 180", "rot90", 2), ("contrast 3", "contrast", 3),
          ("contrast 5", "contrast", 5), ("gaussian_noise 3", "gaussian_noise", 3),
          ("gaussian_noise 5", "gaussian_noise", 5)]
GUARD_OFF = {"widen_if_shifted": False, "abstain_if_ood": False}


def shifted(images: torch.Tensor, kind: str | None, level: int) -> torch.Tensor:
    if kind is None:
        return images
    if kind == "rot90":
        return torch.rot90(images, level, dims=(2, 3))
    return corrupt(images, kind, level, seed=0)


def send(client: httpx.Client, pixels: torch.Tensor, labels: list[int], names: list[str], batch: int,
         extra: dict[str, Any]) -> dict[str, Any]:
    """Every image in requests of ``batch``: per-input outcomes and per-request shift calls and latencies."""
    covered, sizes, answered, wrong, flagged, shifted_requests, latencies = [], [], [], [], [], [], []
    for start in range(0, len(labels), batch):
        body = {"model": MODEL, "seed": start, "coverage": 0.9, "max_risk": 0.05, **extra,
                "inputs": [{"pixels": p} for p in pixels[start:start + batch].round(decimals=4).tolist()]}
        began = time.perf_counter()
        response = client.post("/predict", json=body)
        latencies.append(time.perf_counter() - began)
        response.raise_for_status()
        answer = response.json()
        shifted_requests.append("shift" in answer["decisions"])
        for prediction, truth in zip(answer["predictions"], labels[start:start + batch], strict=True):
            covered.append(names[truth] in prediction["prediction_set"])
            sizes.append(prediction["set_size"])
            flagged.append(prediction["is_ood"])
            answered.append(not prediction["abstain"])
            wrong.append(prediction["class_index"] != truth)
    answered_wrong = [w for a, w in zip(answered, wrong, strict=True) if a]
    return {"coverage": round(float(np.mean(covered)), 4), "mean_set_size": round(float(np.mean(sizes)), 3),
            "answered_share": round(float(np.mean(answered)), 4),
            "answered_error": round(float(np.mean(answered_wrong)), 4) if answered_wrong else None,
            "answered": len(answered_wrong), "ood_share": round(float(np.mean(flagged)), 4),
            "shifted_requests": round(float(np.mean(shifted_requests)), 4),
            "request_p50_ms": round(float(np.median(latencies)) * 1000, 2)}


def guard_cost_ms(batch: int, repeats: int = 2000) -> float:
    """The guard's own work per request of ``batch`` inputs (the binomial test over its flags), in milliseconds."""
    flags = [i % 7 == 0 for i in range(batch)]
    began = time.perf_counter()
    for _ in range(repeats):
        check_shift(flags, 0.05, None)
    return (time.perf_counter() - began) / repeats * 1000


def run(repository: Path, images: int, batch: int, single: bool) -> dict[str, Any]:
    test = load_fashion_mnist_split(FASHION_ROOT, "test")
    pixels, labels = test.images[:images], test.labels[:images].tolist()
    results: dict[str, Any] = {"images": images, "batch": batch, "shifts": {}}
    for name, kind, level in SHIFTS:
        inputs = shifted(pixels, kind, level)
        row: dict[str, Any] = {}
        with running_server(repository, MODEL, 1, []) as url, httpx.Client(base_url=url, timeout=600) as client:
            names = client.get(f"/models/{MODEL}").json()["manifest"]["labels"]
            row["guard"] = send(client, inputs, labels, names, batch, {})
            row["no_guard"] = send(client, inputs, labels, names, batch, GUARD_OFF)
        if single and kind in (None, "rot90") and level <= 1:
            with running_server(repository, MODEL, 1, []) as url, \
                    httpx.Client(base_url=url, timeout=600) as client:
                names = client.get(f"/models/{MODEL}").json()["manifest"]["labels"]
                row["guard_one_per_request"] = send(client, inputs, labels, names, 1, {})
        results["shifts"][name] = row
        print(json.dumps({name: {mode: {k: v for k, v in r.items() if k in ("coverage", "answered_share",
                                                                            "answered_error")}
                                 for mode, r in row.items()}}), flush=True)
    p50 = results["shifts"]["none"]["guard"]["request_p50_ms"]
    results["guard_cost"] = {"ms_per_request": round(guard_cost_ms(batch), 4), "request_p50_ms": p50,
                             "share_of_request": round(guard_cost_ms(batch) / p50, 4)}
    return results


def markdown(results: dict[str, Any], command: str) -> str:
    lines = ["# Prediction sets and abstentions under shift: the shift guard", "",
             f"Generated by `{command}` (`benchmarks-shift-guard.json`): the committed default image model, "
             f"{results['images']:,} Fashion-MNIST test images per shift in requests of {results['batch']}, "
             "`coverage` 0.9 and `max_risk` 0.05, each request sent with the guard (the defaults) and without it "
             "(`widen_if_shifted` and `abstain_if_ood` off). A fresh server per shift.", "",
             "| shift | mode | coverage | mean set size | answered | answered error | OOD flagged | requests called "
             "shifted |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, row in results["shifts"].items():
        for mode, r in row.items():
            error = "n/a (none answered)" if r["answered_error"] is None else f"{r['answered_error']:.3f}"
            lines.append(f"| {name} | {mode.replace('_', ' ')} | {r['coverage']:.3f} | {r['mean_set_size']:.2f} | "
                         f"{r['answered_share']:.1%} | {error} | {r['ood_share']:.1%} | {r['shifted_requests']:.1%} |")
    lines += ["", *verdicts(results)]
    cost = results["guard_cost"]
    lines += ["", f"The guard's own work: {cost['ms_per_request']:.3f} ms per request of {results['batch']} inputs, "
              f"{cost['share_of_request']:.2%} of the request's p50 ({cost['request_p50_ms']:.1f} ms).", ""]
    return "\n".join(lines)


def verdicts(results: dict[str, Any]) -> list[str]:
    """The targets, read off the table: in distribution the guard changes nothing the defaults gave; under each shift
    it answers at max_risk 0.05 with an error of at most 0.10, or answers no input."""
    shifts = results["shifts"]
    calm = shifts["none"]
    guard, bare = calm["guard"], calm["no_guard"]
    lines = [f"- In distribution: coverage {guard['coverage']:.3f} with the guard, {bare['coverage']:.3f} without; "
             f"answered error at 0.05 {guard['answered_error']:.3f} ({guard['answered_share']:.1%} answered; the "
             f"flag's own abstentions, as before the guard); requests called shifted: {guard['shifted_requests']:.1%}."]
    for mode, what in (("guard", f"requests of {results['batch']}"), ("guard_one_per_request", "one image a request")):
        rows = {name: row[mode] for name, row in shifts.items() if name != "none" and mode in row}
        kept = [name for name, r in rows.items() if r["answered_error"] is None or r["answered_error"] <= 0.10]
        missed = [f"{name} ({r['answered_share']:.1%} answered at {r['answered_error']:.3f})"
                  for name, r in rows.items() if name not in kept]
        lines.append(f"- Under shift, {what}: the answered error at 0.05 stays at or below 0.10, or nothing is "
                     f"answered, on {len(kept)} of {len(rows)} shifts" + (f"; missed: {', '.join(missed)}" if missed
                                                                          else "") + ".")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--single", action="store_true", help="also one image a request (in distribution, 90 deg)")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-shift-guard.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "benchmarks-shift-guard.md")
    parser.add_argument("--report-only", action="store_true", help="rewrite the page from --out, measuring nothing")
    args = parser.parse_args(argv)
    if args.report_only:
        results = json.loads(args.out.read_text())
    else:
        results = run(args.repository, args.images, args.batch, args.single)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    command = f"python -m benchmarks.shift_guard --images {args.images} --batch {args.batch}" + \
        (" --single" if args.single else "")
    args.markdown.write_text(markdown(results, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
