"""Small pure pieces: row chunking, the OOD rule lookup, manifest validation and the settings."""

from __future__ import annotations

import pytest

from service.artifact import ArtifactError, ood_rule, validate_manifest
from service.config import Settings
from service.inference import chunks_by_rows
from service.repository import version_key


def test_chunks_bound_rows_and_keep_order() -> None:
    assert chunks_by_rows([4, 4, 4, 4], 8) == [slice(0, 2), slice(2, 4)]
    assert chunks_by_rows([1, 16, 1], 8) == [slice(0, 1), slice(1, 2), slice(2, 3)]  # oversized input alone
    assert chunks_by_rows([2, 2, 2], 100) == [slice(0, 3)]


def test_ood_rule_exact_nearest_and_mutual_information_fallback() -> None:
    manifest = {"ood": {"thresholds": {"1": {"score": "energy", "threshold": -3.0},
                                       "4": {"score": "mutual_information", "threshold": 0.01},
                                       "16": {"score": "mutual_information", "threshold": 0.02}}}}
    assert ood_rule(manifest, 4).threshold == 0.01 and ood_rule(manifest, 4).note is None
    nearest = ood_rule(manifest, 12)
    assert nearest.calibrated_samples == 16 and nearest.score == "mutual_information" and "nearest" in nearest.note
    assert ood_rule(manifest, 1).score == "energy"
    only_mi = {"ood": {"thresholds": {"4": {"score": "mutual_information", "threshold": 0.01}}}}
    with pytest.raises(ArtifactError):
        ood_rule(only_mi, 1)


def test_manifest_validation_reasons() -> None:
    good = {"format_version": "1.3", "name": "m", "version": "1", "modality": "image", "labels": ["a"],
            "input": {}, "sampling": {"default_samples": 2, "max_samples": 4},
            "ood": {"thresholds": {"2": {"score": "energy", "threshold": 0.0}}}, "files": {"director.ts": {}}}
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


def test_service_imports_no_training_stack() -> None:
    import subprocess
    import sys

    script = ("import sys, service.app, service.__main__\n"
              "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('timm', 'transformers', 'training'))\n"
              "print(bad)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
