"""What of the GPU check runs on a CPU: the FLOP count against a hand computation, the peak table, the report
writer on a made-up work folder, and the script and the FLOP benchmark refusing to run without a CUDA device."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

from models.baselines import DeterministicModel

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_flops = load("gpu_flops")
gpu_report = load("gpu_report")


def test_flops_of_a_scripted_artifact_match_the_hand_count() -> None:
    """A deterministic artifact whose classifier is a 3x3 convolution (1 -> 4 channels, padding 1) then a linear
    layer over the flattened maps: per input 2 * (28 * 28 * 4 * 9) for the convolution and 2 * (4 * 784 * 10) for the
    linear layer; sample rows only copy logits, so S does not count."""
    classifier = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 28 * 28, 10))
    module = torch.jit.script(DeterministicModel(classifier).eval())
    batch = 3
    per_input = 2 * (28 * 28 * 4 * 9) + 2 * (4 * 784 * 10)
    pixels = torch.rand(batch, 1, 28, 28)  # [B, 1, 28, 28]
    repeats = torch.tensor([1, 4, 16])  # [B]
    assert gpu_flops.sample_rows_flops(module, pixels, repeats) == batch * per_input


def test_datasheet_peaks_by_device_name() -> None:
    assert gpu_flops.datasheet_peak("NVIDIA H200", "bf16") == 989.5
    assert gpu_flops.datasheet_peak("NVIDIA A100-SXM4-80GB", "fp32") == 156.0
    assert gpu_flops.datasheet_peak("NVIDIA L40S", "bf16") == 362.1
    assert gpu_flops.datasheet_peak("NVIDIA L4", "bf16") == 121.0
    assert gpu_flops.datasheet_peak("Tesla T4", "bf16") is None


def test_the_flop_benchmark_refuses_without_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a GPU host
    out = tmp_path / "flops.json"
    assert gpu_flops.main(["--artifact", str(tmp_path), "--out", str(out)]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not out.exists()


def test_the_gpu_check_refuses_without_cuda_and_writes_nothing(tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES hides any GPU, so this holds on a GPU host too."""
    work = tmp_path / "work"
    result = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "--python", sys.executable, "--work",
                             str(work)], capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2, result.stderr
    assert "no CUDA device" in result.stderr and "nothing was written" in result.stderr
    assert not work.exists() and not (BENCHMARKS.parent / "docs" / "benchmarks-gpu.json").exists()


def test_report_from_a_work_folder(tmp_path: Path) -> None:
    """The report writer on what a run leaves: steps, a JUnit file, FLOP results; a missing piece says missing."""
    (tmp_path / "steps.tsv").write_text("gpu-tests\t0\t61\nserve-fp32\t124\t75\n")
    (tmp_path / "gpu-tests.xml").write_text(
        '<testsuites><testsuite tests="2" failures="0" errors="0" skipped="1">'
        '<testcase classname="tests.gpu.test_nccl" name="test_nccl"><skipped message="needs two CUDA devices"/>'
        '</testcase><testcase classname="tests.gpu.test_cuda_artifact" name="test_fp32"/></testsuite></testsuites>')
    row = {"precision": "bf16", "batch": 1024, "n_samples": 16, "rows": 16384, "ms_per_forward": 12.5,
           "inputs_per_s": 81920.0, "gflops_per_forward": 1500.0, "model_tflops": 120.0,
           "share_of_datasheet_peak": 0.1213, "share_of_measured_matmul_peak": 0.152}
    (tmp_path / "flops.json").write_text(json.dumps({
        "device": "NVIDIA H200", "torch": "2.11.0", "datasheet_peak_tflops": {"bf16": 989.5, "fp32": 494.7},
        "measured_matmul_peak_tflops": {"bf16": 790.0, "fp32": 400.0}, "rows": [row]}))
    timed = {"ms_median": 1.0, "ms_min": 0.9, "ms_max": 1.2, "inputs_per_s": 32000.0}
    (tmp_path / "export-ab.json").write_text(json.dumps({
        "command": "export_ab.py --device cuda", "device": "cuda", "torch": "2.11.0", "repeats": 5,
        "same_seed_max_logit_difference": {"scored_rows": 2e-6},
        "rows": [{"method": "scored_rows", "inputs": 32, "n_samples": 1, "torchscript": timed,
                  "aoti": {**timed, "ms_median": 0.8}, "ratio_median": 0.8, "ratio_range": [0.7, 0.9]}]}))
    markdown, data = tmp_path / "gpu.md", tmp_path / "gpu.json"
    assert gpu_report.main(["--work", str(tmp_path), "--markdown", str(markdown), "--json", str(data)]) == 0
    text = markdown.read_text()
    assert "| serve-fp32 | 124 | 75 |" in text and "2 tests: 0 failed, 0 errors, 1 skipped." in text
    assert "skipped: needs two CUDA devices" in text and "| bf16 | 1024 | 16 | 16384 | 12.5 |" in text
    assert "12.1%" in text and "## Serving, bf16 autocast\n\n(missing)" in text
    assert json.loads(data.read_text())["gpu_tests"]["skipped"] == 1
    assert "same seed, largest logit difference: scored_rows 2.0e-06" in text.lower()
    assert "| scored_rows | 32 x 1 | 1.0 (0.9-1.2) | 0.8 (0.9-1.2) | 32000.0 | 32000.0 | 0.8 (0.7-0.9) |" in text
