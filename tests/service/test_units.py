"""Small pure pieces: row chunking, the OOD rule lookup, manifest validation, the settings and the per-version
metric series."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from artifact.contract import Manifest, Ood, Reference, parse_manifest
from artifact.contract import TextInput as TextSpec
from service.cli import build_parser, settings_from_args
from service.config import Settings
from service.engine.artifact import ArtifactError, ood_rule, validate_manifest
from service.engine.inference import chunks_by_cost
from service.engine.modalities.image import ImageRunner
from service.engine.modalities.text import TextRunner
from service.engine.repository import version_key
from service.engine.texts import pad_batch, padded_length
from service.observability.metrics import REJECT_REASONS, Metrics
from service.observability.reference import reference_values
from tests.repository_facts import WHOLE_STACK_DIRECTOR_DIR
from tests.service.conftest import metric_value


def chunks_by_rows(repeats: list[int], max_batch_samples: int) -> list[slice]:
    return chunks_by_cost(repeats, [0] * len(repeats), ImageRunner((1, 2, 2)).batch_cost(max_batch_samples, 0))


def chunks_by_tokens(lengths: list[int], repeats: list[int], max_batch_tokens: int, max_length: int) -> list[slice]:
    spec = TextSpec(tokenizer="tokenizer.json", max_length=max_length, max_characters=100, padding={"pad_id": 0})
    cost = TextRunner(spec, None).batch_cost(0, max_batch_tokens)  # type: ignore[arg-type]  # no tokenizer needed
    return chunks_by_cost(repeats, lengths, cost)


def test_chunks_bound_rows_and_keep_order() -> None:
    assert chunks_by_rows([4, 4, 4, 4], 8) == [slice(0, 2), slice(2, 4)]
    assert chunks_by_rows([1, 16, 1], 8) == [slice(0, 1), slice(1, 2), slice(2, 3)]  # oversized input alone
    assert chunks_by_rows([2, 2, 2], 100) == [slice(0, 3)]


def test_text_padding_is_right_sided_to_a_multiple_of_8_within_max_length() -> None:
    assert [padded_length(n, 64) for n in (1, 7, 8, 9, 17, 63, 64)] == [8, 8, 8, 16, 24, 64, 64]
    assert padded_length(30, 30) == 30  # never beyond the artifact's position table
    ids, mask = pad_batch([[2, 5, 3], [2, 7, 7, 7, 7, 7, 7, 7, 7, 3]], pad_id=0, max_length=64)
    assert ids.shape == mask.shape == (2, 16) and ids.dtype == mask.dtype == torch.long
    assert ids[0].tolist() == [2, 5, 3] + [0] * 13 and mask[0].tolist() == [1, 1, 1] + [0] * 13
    assert mask[1].sum() == 10 and ids[1, :10].tolist() == [2] + [7] * 8 + [3]


def test_text_chunks_bound_padded_tokens_times_samples() -> None:
    # widths round up to 8: [6 tokens x 4 samples] alone costs 8 x 4 = 32; with a 20-token text, 24 x 8 = 192
    assert chunks_by_tokens([6, 20], [4, 4], 192, 64) == [slice(0, 2)]
    assert chunks_by_tokens([6, 20], [4, 4], 191, 64) == [slice(0, 1), slice(1, 2)]
    assert chunks_by_tokens([30, 6, 6], [8, 8, 8], 256, 32) == [slice(0, 1), slice(1, 3)]  # 32 x 8; 8 x 16
    assert chunks_by_tokens([32], [64], 100, 32) == [slice(0, 1)]  # an input over the budget gets its own forward


def test_text_manifest_validation_reasons() -> None:
    good = {"format_version": "1.0", "name": "t", "version": "1", "modality": "text", "labels": ["a", "b"],
            "input": {"tokenizer": "tokenizer.json", "max_length": 32, "max_characters": 200,
                      "truncation": {"side": "right"}, "padding": {"side": "right", "pad_id": 0}},
            "sampling": {"default_samples": 2, "max_samples": 4},
            "ood": {"thresholds": {"2": {"score": "energy", "threshold": 0.0}}},
            "files": {"director.ts": {"sha256": "0" * 64}, "tokenizer.json": {"sha256": "1" * 64}}}
    spec = validate_manifest(good).input
    assert (spec.tokenizer, spec.max_length, spec.max_characters, spec.pad_id, spec.truncation_side) == (
        "tokenizer.json", 32, 200, 0, "right")
    section = good["input"]
    for change, reason in [({"tokenizer": None}, "input.tokenizer"), ({"tokenizer": "vocab.txt"}, "do not list"),
                           ({"max_length": 1}, "max_length"), ({"max_characters": "200"}, "max_characters"),
                           ({"padding": {"side": "left", "pad_id": 0}}, "right only"),
                           ({"padding": {"side": "right"}}, "pad_id"),
                           ({"truncation": {"side": "middle"}}, "truncation.side")]:
        with pytest.raises(ArtifactError, match=reason):
            validate_manifest({**good, "input": {**section, **change}})
    with pytest.raises(ArtifactError, match="tokenizer"):
        validate_manifest({**good, "files": {"director.ts": {"sha256": "0" * 64}}})


def test_ood_rule_exact_nearest_and_mutual_information_fallback() -> None:
    manifest = Ood(thresholds={"1": {"score": "energy", "threshold": -3.0},
                               "4": {"score": "mutual_information", "threshold": 0.01},
                               "16": {"score": "mutual_information", "threshold": 0.02}})
    assert ood_rule(manifest, 4).threshold == 0.01 and ood_rule(manifest, 4).note is None
    nearest = ood_rule(manifest, 12)
    assert nearest.calibrated_samples == 16 and nearest.score == "mutual_information" and "nearest" in nearest.note
    assert ood_rule(manifest, 1).score == "energy"
    only_mi = Ood(thresholds={"4": {"score": "mutual_information", "threshold": 0.01}})
    with pytest.raises(ArtifactError):
        ood_rule(only_mi, 1)


def test_manifest_validation_reasons() -> None:
    good = {"format_version": "1.3", "name": "m", "version": "1", "modality": "image", "labels": ["a"],
            "input": {"channels": 1, "height": 28, "width": 28}, "sampling": {"default_samples": 2, "max_samples": 4},
            "ood": {"thresholds": {"2": {"score": "energy", "threshold": 0.0}}},
            "files": {"director.ts": {"sha256": "0" * 64}}}
    validate_manifest(good)  # a newer minor version is accepted
    for change, reason in [({"format_version": "2.0"}, "unsupported format_version"),
                           ({"modality": "audio"}, "modality"), ({"files": {}}, "director.ts"),
                           ({"sampling": {"default_samples": 8, "max_samples": 4}}, "default_samples"),
                           ({"ood": {"thresholds": {"2": {"score": "vibes", "threshold": 0}}}}, "thresholds")]:
        with pytest.raises(ArtifactError, match=reason):
            validate_manifest({**good, **change})
    with pytest.raises(ArtifactError, match="lacks labels"):
        validate_manifest({k: v for k, v in good.items() if k != "labels"})


def test_versions_sort_numerically() -> None:
    assert sorted(["10", "2", "1", "beta"], key=version_key) == ["beta", "1", "2", "10"]


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIRECTOR_MAX_BATCH_SAMPLES", "64")
    monkeypatch.setenv("DIRECTOR_DEVICE", "cpu")
    monkeypatch.setenv("DIRECTOR_API_KEY", "topsecret-key")
    settings = Settings()
    assert settings.max_batch_samples == 64 and settings.device == "cpu"
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "topsecret-key"
    assert "topsecret-key" not in repr(settings)


@pytest.mark.parametrize("empty", ["", "   "])
def test_an_empty_api_key_means_no_key(monkeypatch: pytest.MonkeyPatch, empty: str) -> None:
    """``DIRECTOR_API_KEY=`` is what compose passes for a variable left empty in .env: no key, not a key that no
    bearer token matches (the live server with an empty key is in test_overload_auth.py)."""
    monkeypatch.setenv("DIRECTOR_API_KEY", empty)
    assert Settings().api_key is None
    assert Settings(api_key=empty).api_key is None
    assert Settings(api_key=" key ").api_key is not None  # a real key is kept as given


def test_the_key_is_never_a_command_line_flag(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A flag would show the key to every user of the machine (``ps``): environment or file only."""
    for name in ("DIRECTOR_API_KEY", "DIRECTOR_API_KEY_FILE"):  # settings_from_args exports flags: restored after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    with pytest.raises(SystemExit):
        settings_from_args(["--api-key", "s3cret"])
    assert "--api-key " not in build_parser().format_help() and "--api-key-file" in build_parser().format_help()
    capsys.readouterr()
    secret = tmp_path / "key"
    secret.write_text("  s3cret\n")
    settings = settings_from_args(["--api-key-file", str(secret)])
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "s3cret"
    assert os.environ["DIRECTOR_API_KEY_FILE"] == str(secret)  # what worker processes read, not the key itself
    assert "DIRECTOR_API_KEY" not in os.environ


def test_the_key_file_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_text("k3y")
    monkeypatch.delenv("DIRECTOR_API_KEY", raising=False)
    monkeypatch.setenv("DIRECTOR_API_KEY_FILE", str(secret))
    settings = Settings()
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "k3y"
    assert "k3y" not in repr(settings)


@pytest.mark.parametrize(("content", "key", "reason"), [
    ("", None, "is empty"), (" \n", None, "is empty"), (None, None, "cannot read"), ("k", "other", "not both")])
def test_a_bad_key_file_stops_the_server(tmp_path: Path, content: str | None, key: str | None, reason: str) -> None:
    """A named file means a key was meant: empty, unreadable or doubled is an error, never an open server."""
    secret = tmp_path / "key"
    if content is not None:
        secret.write_text(content)
    with pytest.raises(ValidationError, match=reason):
        Settings(api_key_file=secret, api_key=key)


def committed_manifest() -> Manifest:
    return parse_manifest(json.loads((WHOLE_STACK_DIRECTOR_DIR / "manifest.json").read_text()))


def test_reference_values_from_the_committed_manifest_and_fallbacks() -> None:
    manifest = committed_manifest()
    reference = manifest.reference
    assert reference is not None and reference.quantile_levels is not None
    values = reference_values(manifest)
    assert values["accuracy"] == reference.accuracy and values["ece"] == reference.ece
    assert values["ood_rate"] == reference.ood_rate and 0.03 < values["ood_rate"] < 0.08  # ~5% at 95% TPR
    for distribution in ("confidence", "predictive_entropy", "mutual_information"):
        quantiles = getattr(reference, f"{distribution}_quantiles")
        assert values[f"{distribution}@0.5"] == pytest.approx(quantiles[reference.quantile_levels.index(0.5)])
    # without a measured OOD rate, 1 - the thresholds' TPR; quantiles between levels are interpolated
    sparse = manifest.model_copy(update={
        "ood": manifest.ood.model_copy(update={"tpr": 0.9}),
        "reference": Reference(quantile_levels=[0.0, 0.2, 1.0], confidence_quantiles=[0.5, 0.7, 1.0])})
    assert reference_values(sparse) == {
        "ood_rate": pytest.approx(0.1), "confidence@0.1": pytest.approx(0.6), "confidence@0.5": pytest.approx(0.8125),
        "confidence@0.9": pytest.approx(0.9625)}
    # nothing usable: nothing exported (no NaN, no exception)
    broken = manifest.model_copy(update={"ood": manifest.ood.model_copy(update={"tpr": None}), "reference": Reference(
        ece=float("nan"), quantile_levels=[0.5], confidence_quantiles=[0.9])})
    assert reference_values(broken) == {}
    assert reference_values(manifest.model_copy(update={"ood": manifest.ood.model_copy(update={"tpr": None}),
                                                        "reference": None})) == {}


def test_published_series_follow_the_version() -> None:
    metrics = Metrics()
    manifest = committed_manifest()
    assert manifest.reference is not None
    metrics.publish_version("m", "1", manifest, max_queue=64)
    text = metrics.expose().decode()
    assert metric_value(text, "director_reference_accuracy_ratio", model="m", version="1") == \
        manifest.reference.accuracy
    assert metric_value(text, "director_reference_confidence_ratio", model="m", version="1", quantile="0.9") is not None
    assert metric_value(text, "director_queue_capacity", model="m", version="1") == 64.0
    assert metric_value(text, "director_queue_depth", model="m", version="1") == 0.0
    for count, rule in manifest.ood.thresholds.items():  # the flag's threshold, per calibrated sample count
        assert metric_value(text, "director_ood_threshold", model="m", version="1", n_samples=str(count),
                            score=rule.score) == pytest.approx(rule.threshold)
    for reason in REJECT_REASONS:  # every counter child exists before its first increment
        assert metric_value(text, "director_rejected_requests_total", model="m", version="1", reason=reason) == 0.0
    for counter in ("director_predictions_total", "director_ood_predictions_total", "director_feedback_total"):
        assert metric_value(text, counter, model="m", version="1") == 0.0, counter
    # the same version reloaded with a manifest lacking the reference block: its reference series go
    metrics.publish_version("m", "1", manifest.model_copy(update={"reference": None}), max_queue=64)
    text = metrics.expose().decode()
    assert metric_value(text, "director_reference_accuracy_ratio", model="m", version="1") is None
    assert metric_value(text, "director_reference_ood_ratio", model="m", version="1") == pytest.approx(0.05)  # tpr
    metrics.unpublish_version("m", "1")
    text = metrics.expose().decode()
    for name in ("director_reference_ood_ratio", "director_queue_capacity"):
        assert metric_value(text, name, model="m", version="1") is None, name
    assert "director_ood_threshold{" not in text
    assert metric_value(text, "director_predictions_total", model="m", version="1") == 0.0  # counters are history
    metrics.set_model_info({("m", "1", "director", "loading")})
    metrics.set_model_info({("m", "1", "director", "ready")})
    text = metrics.expose().decode()
    assert metric_value(text, "director_model_info", model="m", version="1", state="ready") == 1.0
    assert metric_value(text, "director_model_info", model="m", version="1", state="loading") is None


def test_uvicorn_runs_the_standard_extras() -> None:
    """uvicorn[standard]: the httptools parser (not pure-Python h11) and uvloop, which uvicorn's default
    ``loop="auto"`` picks whenever it is importable."""
    import importlib.util

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from service.server import uvicorn_config

    config = uvicorn_config(object(), Settings())
    config.load()
    assert issubclass(config.http_protocol_class, HttpToolsProtocol)  # with the server's slow-client timeouts
    assert config.loop == "auto" and importlib.util.find_spec("uvloop") is not None


def test_service_imports_no_training_stack() -> None:
    import subprocess
    import sys

    script = ("import sys, service.app, service.__main__\n"
              "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('timm', 'transformers', 'training'))\n"
              "print(bad)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
