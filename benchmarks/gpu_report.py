"""Write ``docs/benchmarks-gpu.md`` and ``.json`` from what ``benchmarks/gpu_check.sh`` left in its work folder:
the GPU tests (JUnit XML), ``serve_load.py`` in fp32 and bf16 (JSON and Markdown tables), the raw artifact's
throughput and FLOP/s (``gpu_flops.py``), the distillation epoch's time and the AOTInductor package's forwards against
TorchScript's (``export_ab.py``). A missing piece is reported as missing with the step's exit status, never left out
silently."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from types import ModuleType
from typing import Any


def sibling(name: str) -> ModuleType:
    """A module of this folder by its path (this script runs from any working directory, and is loaded by path)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ANALYSIS_MARKER = "<!-- analysis: written by hand below this line; --markdown keeps it -->"


def read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def read_steps(path: Path) -> dict[str, dict[str, int]]:
    """``name<TAB>exit status<TAB>seconds`` lines (gpu_check.sh's ``step``) as ``{name: {status, seconds}}``."""
    if not path.is_file():
        return {}
    rows = (line.split("\t") for line in path.read_text().splitlines() if line.strip())
    return {name: {"status": int(status), "seconds": int(seconds)} for name, status, seconds in rows}


def test_summary(path: Path) -> dict[str, Any] | None:
    """Counts and the failing or skipped tests of a pytest JUnit XML file."""
    if not path.is_file():
        return None
    root = ElementTree.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    cases = []
    for case in suite.iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = f"{tag}: {(found.get('message') or '').splitlines()[0][:200] if found.get('message') else ''}"
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome})
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")} | {"cases": cases}


def tables_of(markdown: Path) -> list[str]:
    """The generated part of a ``serve_load.py --markdown`` file (above its analysis marker), minus its title."""
    if not markdown.is_file():
        return ["(missing)"]
    text = markdown.read_text().split(ANALYSIS_MARKER)[0].strip().splitlines()
    return [line for line in text if not line.startswith("# ")]


def flops_lines(flops: dict[str, Any] | None) -> list[str]:
    if flops is None:
        return ["(missing)"]
    sheet, measured = flops["datasheet_peak_tflops"], flops["measured_matmul_peak_tflops"]
    lines = [f"Device {flops['device']}, torch {flops['torch']}. Peaks: datasheet bf16 {sheet['bf16']} / TF32 "
             f"{sheet['fp32']} TFLOP/s; measured 8192^3 matmul bf16 {measured['bf16']} / TF32 {measured['fp32']} "
             "TFLOP/s. FLOPs counted per forward with torch.utils.flop_counter on the device.", "",
             "| precision | batch | S | rows | ms per forward | inputs/s | GFLOP per forward | TFLOP/s | "
             "share of datasheet peak | share of measured matmul peak |", "| --- " * 10 + "|"]
    for r in flops["rows"]:
        share = "-" if r["share_of_datasheet_peak"] is None else f"{100 * r['share_of_datasheet_peak']:.1f}%"
        lines.append(f"| {r['precision']} | {r['batch']} | {r['n_samples']} | {r['rows']} | {r['ms_per_forward']} | "
                     f"{r['inputs_per_s']} | {r['gflops_per_forward']} | {r['model_tflops']} | {share} | "
                     f"{100 * r['share_of_measured_matmul_peak']:.1f}% |")
    quality = flops.get("quality")
    if quality is not None:
        lines += ["", f"fp32 vs bf16 on the first {quality['inputs']} test images at S = {quality['n_samples']} "
                  f"(same seed): label agreement {100 * quality['label_agreement']:.2f}%.", "",
                  "| precision | accuracy | ECE | NLL |", "| --- | --- | --- | --- |"]
        lines += [f"| {p} | {quality[p]['accuracy']} | {quality[p]['ece']} | {quality[p]['nll']} |"
                  for p in ("fp32", "bf16")]
    return lines


def export_lines(export_ab: dict[str, Any] | None) -> list[str]:
    """The package's forwards against TorchScript's on this GPU (``benchmarks/export_ab.py``'s results)."""
    if export_ab is None:
        return ["(missing)"]
    agreement = ", ".join(f"{method} {value:.1e}" for method, value in
                          export_ab["same_seed_max_logit_difference"].items())
    return [f"`{export_ab['command']}` on {export_ab['device']}, torch {export_ab['torch']}, {export_ab['repeats']} "
            "paired repeats per point (the formats alternating); a ratio is the package's time over TorchScript's "
            f"in the same repeat. Same seed, largest logit difference: {agreement}.", "",
            *sibling("report").export_table(export_ab)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="gpu_check.sh's work folder")
    parser.add_argument("--markdown", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    work = args.work
    steps = read_steps(work / "steps.tsv")
    results: dict[str, Any] = {
        "host": read_json(work / "host.json"), "steps": steps, "gpu_tests": test_summary(work / "gpu-tests.xml"),
        "serve_fp32": read_json(work / "serve-fp32.json"), "serve_bf16": read_json(work / "serve-bf16.json"),
        "raw_artifact": read_json(work / "flops.json"), "distillation": read_json(work / "distil.json"),
        "export_ab": read_json(work / "export-ab.json"),
    }
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    host = results["host"] or {}
    lines = ["# GPU check", "",
             f"Written by `benchmarks/gpu_check.sh` ({host.get('date', '?')}): {host.get('gpu', '?')}, "
             f"driver {host.get('driver', '?')}, torch {host.get('torch', '?')} (CUDA {host.get('cuda', '?')}), "
             f"Python {host.get('python', '?')}. Every figure is also in `{args.json.name}`.", "",
             "| step | exit status | seconds |", "| --- | --- | --- |"]
    lines += [f"| {name} | {step['status']} | {step['seconds']} |" for name, step in steps.items()]
    tests = results["gpu_tests"]
    lines += ["", "## GPU tests (`tests/gpu`)", ""]
    if tests is None:
        lines.append("(missing)")
    else:
        lines.append(f"{tests['tests']} tests: {tests['failures']} failed, {tests['errors']} errors, "
                     f"{tests['skipped']} skipped.")
        lines += [""] + [f"- `{case['test']}`: {case['outcome']}" for case in tests["cases"]]
    lines += ["", "## Serving, fp32 (TF32 matmuls)", "", *tables_of(work / "serve-fp32.md")]
    lines += ["", "## Serving, bf16 autocast", "", *tables_of(work / "serve-bf16.md")]
    lines += ["", "## Raw artifact: throughput and FLOP/s", "", *flops_lines(results["raw_artifact"])]
    distillation = results["distillation"]
    lines += ["", "## One distillation epoch", ""]
    if distillation is None:
        lines.append("(missing)")
    else:
        lines.append(f"`{distillation['command']}`: {distillation['seconds']} s for the stage (teacher preparation, "
                     f"start states and one epoch); the run's own count: {distillation.get('run_seconds')} s.")
    lines += ["", "## torch.export (AOTInductor) against TorchScript on CUDA", "", *export_lines(results["export_ab"])]
    args.markdown.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.markdown} and {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
