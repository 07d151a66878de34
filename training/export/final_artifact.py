"""The artifact an export serves, written once the OOD score and the temperature are chosen (docs/architecture.md,
"Export"): the TorchScript file computing only the feature scores the manifest reads, and the AOTInductor package
when ``export.format`` asks for one."""

from __future__ import annotations

from pathlib import Path

import torch

from artifact.contract import ARTIFACT
from artifact.formats import AOTI_FORMAT
from models.director import NoFeatureScores
from models.hybrid import HybridCore
from training.posthoc.feature_statistics import keep_scores
from training.posthoc.modality_parts import ExportParts
from training.posthoc.ood_selection import returns_input_scores, score_names
from training.posthoc.writing import script_and_verify


def finish_artifact(parts: ExportParts, export_format: str, artifact_module: torch.nn.Module,
                    served: torch.jit.ScriptModule, scores_read: set[str], tmp_dir: Path) -> None:
    """Write the artifact that is served: scripted again computing only the per-input scores the manifest reads and
    checked against ``served``, which the statistics were measured on: the same rows under one seed, the kept columns
    equal. A DIRECTOR whose manifest reads none drops its teacher transitions and feature scorer (it runs no backbone
    layer beyond its prefix); otherwise the unread feature scores are dropped with their statistics
    (``FeatureScorer.keep``). With ``export.format: aoti`` the AOTInductor package is compiled from it and verified
    against its TorchScript file (``training.export.torch_export``)."""
    probe = parts.data.val.first_args(8)
    measured = score_names(served)
    if drop_unread_teacher(artifact_module, scores_read & set(measured)):
        trimmed = script_and_verify(artifact_module, artifact_module, probe, tmp_dir / ARTIFACT)
        ones = torch.ones(probe[0].shape[0], dtype=torch.long)  # [b]
        torch.manual_seed(0)
        rows = served.sample_rows(*probe, ones)  # [b, C]
        torch.manual_seed(0)
        if not torch.allclose(rows, trimmed.sample_rows(*probe, ones), rtol=1e-5, atol=1e-6):
            raise RuntimeError("the artifact without its teacher transitions differs from the one measured")
        served = trimmed
    elif keep_scores(artifact_module, scores_read):
        columns = [measured.index(name) for name in score_names(artifact_module)]
        trimmed = script_and_verify(artifact_module, artifact_module, probe, tmp_dir / ARTIFACT)
        ones = torch.ones(probe[0].shape[0], dtype=torch.long)  # [b]
        torch.manual_seed(0)
        rows, scores = served.scored_rows(*probe, ones)  # [b, C], [b, 1 + F]
        torch.manual_seed(0)
        trimmed_rows, trimmed_scores = trimmed.scored_rows(*probe, ones)  # [b, C], [b, 1 + len(kept)]
        if not (torch.allclose(rows, trimmed_rows, rtol=1e-5, atol=1e-6)
                and torch.allclose(scores[:, columns], trimmed_scores, rtol=1e-5, atol=1e-7)):
            raise RuntimeError("the artifact keeping only the served scores differs from the one they were measured on")
        served = trimmed
    if export_format == AOTI_FORMAT:
        from training.export.torch_export import write_compiled

        parts.artifact_details.update(write_compiled(artifact_module, served, probe, tmp_dir))


def drop_unread_teacher(module: torch.nn.Module, input_scores_read: set[str]) -> bool:
    """When the manifest reads no per-input score, remove a DIRECTOR artifact module's teacher transitions and feature
    scorer (``scored_rows`` is then not part of its contract); whether anything was removed. A hybrid keeps them: the
    teacher transitions are its forward."""
    rollout = getattr(module, "rollout", None)
    if input_scores_read or rollout is None or isinstance(module, HybridCore) or not returns_input_scores(module):
        return False
    rollout.drop_teacher()
    module.feature_scorer = NoFeatureScores()
    return True
