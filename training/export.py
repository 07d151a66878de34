"""Stage 3: export ``director.ts`` + ``manifest.json`` into the model repository and record the
evaluation the manifest needs (reference statistics, OOD score choice and thresholds, test metrics)."""

from __future__ import annotations

import copy
import datetime as dt
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from models.artifact_format import ARTIFACT, FORMAT_VERSION
from models.director import ImageDirector
from models.uncertainty import OOD_SCORES, UncertaintySummary, ood_score, summarize
from training.artifact import git_commit, install_version, script_and_verify, staging_dir, write_manifest
from training.calibration import fit_temperature
from training.config import ExportConfig, PipelineConfig, config_dict
from training.data import Dataset, Split, digits_images, load_dataset, photo_patch_images, uniform_noise_images
from training.distil import load_director
from training.fit_backbone import load_backbone
from training.metrics import classification_report, ece_bootstrap
from training.ood import auroc, threshold_at_tpr
from training.plots import reliability_diagram
from training.predict import chunked, sampled_logits
from training.report import write_results
from training.runtime import load_checkpoint, set_threads

QUANTILES = 101  # reference distributions are stored as this many evenly spaced quantiles


def _sampled(model: torch.nn.Module, images: torch.Tensor, n_samples: int, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return sampled_logits(model, images, n_samples)  # [S, N, C]


def fit_noise_scale(director: ImageDirector, split: Split, grid: list[float], n_samples: int, seed: int
                    ) -> tuple[float, dict[str, float]]:
    """Noise temperature: the std multiplier minimising validation NLL (kept at 1.0 for a 1-point grid)."""
    if len(grid) <= 1:
        return (grid[0] if grid else 1.0), {}
    scores = {}
    for scale in grid:
        director.rollout.noise_scale.fill_(scale)
        probs = summarize(_sampled(director, split.images, n_samples, seed)).probabilities
        scores[str(scale)] = classification_report(probs, split.labels)["nll"]
    best = float(min(scores, key=scores.get))
    director.rollout.noise_scale.fill_(best)
    return best, scores


@torch.no_grad()
def rollout_trace(director: ImageDirector, images: torch.Tensor, seed: int) -> tuple[dict[str, list[float]],
                                                                                         torch.Tensor]:
    """One S = 1 rollout: per step the median predicted std over RMS(X_t) and the mean predicted
    log-variance, and per input the DIRECTOR-native OOD score (mean predicted log-variance along the
    rollout, [N])."""
    torch.manual_seed(seed)
    rollout = director.rollout
    x = director.embedding(images)  # [B, N, D]
    ratios, logvars = [], []
    per_input = torch.zeros(images.shape[0])
    for t in range(1, rollout.num_steps + 1):
        mean, std = rollout.step(x, t, None)  # [B, N, D]
        x = mean + std * torch.randn_like(mean)
        ratios.append(float(std.median() / x.square().mean().sqrt()))
        logvar = 2 * std.log()  # [B, N, D]
        logvars.append(float(logvar.mean()))
        per_input += logvar.mean(dim=(1, 2)) / rollout.num_steps
    return {"median_std_over_rms": ratios, "mean_logvar": logvars}, per_input


def mean_logvar_score(director: ImageDirector, images: torch.Tensor, seed: int) -> torch.Tensor:
    return chunked(lambda x: rollout_trace(director, x, seed)[1], images, 256)  # [N]


def _reference(summary: UncertaintySummary, labels: torch.Tensor, n_samples: int) -> dict[str, Any]:
    q = torch.linspace(0, 1, QUANTILES, dtype=torch.float64)
    report = classification_report(summary.probabilities, labels)
    return {
        "split": "validation", "n_samples": n_samples, "n_inputs": int(labels.shape[0]), **report,
        "quantile_levels": q.tolist(),
        "confidence_quantiles": torch.quantile(summary.confidence.double(), q).tolist(),
        "predictive_entropy_quantiles": torch.quantile(summary.predictive_entropy.double(), q).tolist(),
        "mutual_information_quantiles": torch.quantile(summary.mutual_information.double(), q).tolist(),
        "confidence_deciles": torch.quantile(summary.confidence.double(), torch.linspace(0.1, 0.9, 9,
                                                                                            dtype=torch.float64)).tolist(),
    }


@dataclass
class ServedStatistics:
    """What every manifest needs from the artifact that will be served, whatever its method."""

    reference: dict[str, Any]
    ood: dict[str, Any]


def served_statistics(served: torch.nn.Module, data: Dataset, ecfg: ExportConfig, sample_counts: list[int],
                      default_s: int, seed: int) -> ServedStatistics:
    """Reference distributions on validation, the OOD score chosen by AUROC on the OOD-validation set
    (sklearn photo patches, none of the reported sets), and its 95%-TPR threshold per sample count."""
    image_shape = tuple(int(s) for s in data.val.images.shape[1:])
    val_logits = _sampled(served, data.val.images, default_s, seed)  # [S, Nv, C]
    val_summary = summarize(val_logits)
    reference = _reference(val_summary, data.val.labels, default_s)
    ood_val = photo_patch_images(ecfg.ood_validation_images, image_shape, seed)
    ood_val_summary = summarize(_sampled(served, ood_val, default_s, seed))
    candidates = [n for n in OOD_SCORES if default_s > 1 or n != "mutual_information"]
    score_auroc = {name: auroc(ood_score(val_summary, name), ood_score(ood_val_summary, name)) for name in candidates}
    chosen = max(score_auroc, key=score_auroc.get)
    fallback = max((n for n in score_auroc if n != "mutual_information"), key=score_auroc.get)

    thresholds: dict[str, dict[str, Any]] = {}
    # thresholds come from a validation subset; the reference OOD rate is measured on the whole split below
    id_subset = data.val.head(ecfg.threshold_images)
    for n_samples in sample_counts:
        if n_samples == default_s:  # draws at this sample count exist already: reuse them, do not sample again
            summary = summarize(val_logits[:, : len(id_subset)])
        else:
            summary = summarize(_sampled(served, id_subset.images, n_samples, seed))
        name = chosen if not (chosen == "mutual_information" and n_samples < 2) else fallback
        thresholds[str(n_samples)] = {"score": name, "threshold": threshold_at_tpr(ood_score(summary, name))}
    default_entry = thresholds[str(default_s)]
    reference["ood_rate"] = float((ood_score(val_summary, default_entry["score"]) > default_entry["threshold"])
                                  .float().mean())
    ood = {"score": chosen, "fallback_score": fallback, "tpr": 0.95, "thresholds": thresholds,
           "selection_set": "sklearn sample-photo patches (OOD validation only)", "selection_auroc": score_auroc}
    return ServedStatistics(reference, ood)


def export(cfg: PipelineConfig) -> Path:
    t_start = time.perf_counter()
    set_threads(cfg.threads)
    ecfg = cfg.export
    run_dir = Path(cfg.run_dir)
    data = load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.val_size, cfg.data.split_seed,
                        cfg.data.train_limit, cfg.data.test_limit)
    director, payload = load_director(run_dir)
    backbone = load_backbone(run_dir)
    backbone_payload = load_checkpoint(run_dir / "backbone.pt")
    image_shape = tuple(int(s) for s in data.test.images.shape[1:])
    default_s = ecfg.default_samples
    progress = tqdm(total=8, desc="export", leave=False)

    noise_scale, noise_scale_nll = fit_noise_scale(
        director, data.val.head(ecfg.threshold_images), ecfg.noise_scale_grid, default_s, cfg.seed)
    progress.update()

    # TorchScript artifact: adaLN folded into per-step buffers; written to a temporary folder first
    out_dir = Path(ecfg.repository) / ecfg.name / str(ecfg.version)
    tmp_dir = staging_dir(out_dir)
    artifact_module = copy.deepcopy(director).eval()
    artifact_module.rollout.fold_conditioning()
    served = script_and_verify(artifact_module, director, data.val.images[:8], tmp_dir / ARTIFACT)
    progress.update()

    # reference statistics and the OOD score, from the artifact that will be served
    served_stats = served_statistics(served, data, ecfg, ecfg.sample_counts, default_s, cfg.seed)
    reference, ood_section = served_stats.reference, served_stats.ood
    chosen, thresholds = ood_section["score"], ood_section["thresholds"]
    progress.update(3)

    # test-split figures: backbone, temperature-scaled backbone, DIRECTOR; MI on test and OOD sets
    test = data.test
    backbone_val_logits = chunked(backbone, data.val.images, 512)
    backbone_test_logits = chunked(backbone, test.images, 512)
    temperature = fit_temperature(backbone_val_logits, data.val.labels)
    backbone_probs = backbone_test_logits.softmax(-1)
    ts_probs = (backbone_test_logits / temperature).softmax(-1)
    test_summary = summarize(_sampled(served, test.images, default_s, cfg.seed))
    s1_summary = summarize(_sampled(served, test.images, 1, cfg.seed))
    progress.update()
    noise = uniform_noise_images(1000, image_shape, cfg.seed + 1)
    digits = digits_images(image_shape)
    noise_summary = summarize(_sampled(served, noise, default_s, cfg.seed))
    digits_summary = summarize(_sampled(served, digits, default_s, cfg.seed))
    diagnostics, _ = rollout_trace(director, test.images[:500], cfg.seed)
    test_logvar = mean_logvar_score(director, test.images, cfg.seed)
    progress.update()

    def block(probs: torch.Tensor) -> dict[str, float]:
        value, low, high = ece_bootstrap(probs, test.labels)
        report = classification_report(probs, test.labels)
        return {**report, "ece_ci95": [low, high], "ece_half_width": (high - low) / 2, "n": int(test.labels.shape[0])}

    default_threshold = thresholds[str(default_s)]["threshold"]

    def ood_block(summary: UncertaintySummary) -> dict[str, Any]:
        return {
            "mean_mutual_information": float(summary.mutual_information.mean()),
            "auroc_vs_test": {n: auroc(ood_score(test_summary, n), ood_score(summary, n)) for n in OOD_SCORES},
            "flagged_rate": float((ood_score(summary, chosen) > default_threshold).float().mean()),
        }

    ood_sets = {"uniform_noise": (noise, noise_summary), "sklearn_digits_upsampled": (digits, digits_summary)}
    ood_metrics = {}
    for name, (images, summary) in ood_sets.items():
        ood_metrics[name] = ood_block(summary)
        ood_metrics[name]["auroc_vs_test"]["mean_logvar"] = auroc(test_logvar,
                                                                  mean_logvar_score(director, images, cfg.seed))

    test_metrics = {
        "backbone": block(backbone_probs),
        "backbone_temperature_scaled": {**block(ts_probs), "temperature": temperature},
        f"director_s{default_s}": {**block(test_summary.probabilities),
                                   "mean_mutual_information": float(test_summary.mutual_information.mean()),
                                   "flagged_rate": float((ood_score(test_summary, chosen)
                                                          > thresholds[str(default_s)]["threshold"]).float().mean())},
        "director_s1": block(s1_summary.probabilities),
        "ood": ood_metrics,
    }

    stats = payload["stats"]
    manifest = {
        "format_version": FORMAT_VERSION,
        "name": ecfg.name,
        "version": str(ecfg.version),
        "method": "director",
        "modality": "image",
        "labels": list(data.labels),
        "input": {
            "channels": image_shape[0], "height": image_shape[1], "width": image_shape[2],
            "dtype": "float32", "range": [0.0, 1.0],
            "layout": "NCHW",
            "convert": {"color": "L" if image_shape[0] == 1 else "RGB",
                        "resize": "bilinear to height x width, aspect ratio not kept",
                        "note": "Fashion-MNIST convention: a light object on a dark background"},
        },
        "sampling": {"steps": director.rollout.num_steps, "default_samples": default_s,
                     "max_samples": ecfg.max_samples, "noise_scale": noise_scale},
        "variance": {"observed_variance": payload["observed_variance"], "tau": payload["tau"],
                     "floors": [float(f) for f in payload["floors"]],
                     "tau_selection_accuracy": payload["tau_accuracies"]},
        "temperature": 1.0,
        "ood": ood_section,
        "reference": reference,
        "artifact": {"file": ARTIFACT, "format": "torchscript", "torch": torch.__version__,
                     "forward": "forward(pixels: Tensor[B, C, H, W] float32 in [0, 1], n_samples: int) "
                                "-> Tensor[n_samples, B, num_classes]",
                     "sample_rows": "sample_rows(pixels, repeats: Tensor[B] int64) "
                                    "-> Tensor[sum(repeats), num_classes]",
                     "parameters": sum(p.numel() for p in artifact_module.parameters())},
        "provenance": {
            "backbone": {"kind": "timm VisionTransformer (hybrid conv stem)" if cfg.backbone.stem_channels
                         else "timm VisionTransformer", **config_dict(cfg)["backbone"],
                         "parameters": sum(p.numel() for p in backbone.parameters())},
            "dataset": cfg.data.dataset, "config": cfg.source, "seed": cfg.seed, "git_commit": git_commit(),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "seconds": {"fit_backbone": backbone_payload["seconds"], "distil": payload["seconds"],
                        "export": None},
            "test_metrics": test_metrics,
            "noise_scale_nll": noise_scale_nll,
            "rollout": diagnostics,
            "step_statistics": {k: [float(x) for x in v] for k, v in stats.items()},
            "distil_history": payload["history"],
        },
    }
    manifest["provenance"]["seconds"]["export"] = round(time.perf_counter() - t_start, 1)
    write_manifest(tmp_dir, manifest)
    install_version(tmp_dir, out_dir)
    progress.update()
    progress.close()
    (run_dir / "export_report.json").write_text(json.dumps(manifest, indent=2) + "\n")
    docs_dir = Path(ecfg.docs_dir)
    png = reliability_diagram({"backbone": backbone_probs, f"backbone + TS (T={temperature:.2f})": ts_probs,
                               f"DIRECTOR S={default_s}": test_summary.probabilities},
                              test.labels, docs_dir / f"{ecfg.name}-reliability.png")
    write_results(manifest, docs_dir, f"python -m training all --config {cfg.source}", png)
    print(f"exported {out_dir} (OOD score {chosen}, fallback {ood_section['fallback_score']}); test: "
          f"backbone acc {test_metrics['backbone']['accuracy']:.4f} ece {test_metrics['backbone']['ece']:.4f}, "
          f"DIRECTOR S={default_s} acc {test_metrics[f'director_s{default_s}']['accuracy']:.4f} "
          f"ece {test_metrics[f'director_s{default_s}']['ece']:.4f}")
    return out_dir
