"""What each modality contributes to an export, DIRECTOR's or a baseline's (``ExportParts``): its data, how its
artifact is built and verified, the post-hoc path and the hybrid built from that artifact (also the evaluation's rows),
its OOD sets, its manifest ``input`` section and signatures.

Image: reported OOD sets uniform noise and upsampled digits. Text: the artifact also ships the run's
``tokenizer.json``; its word table is stored as ``text.table_dtype`` and the adaLN MLPs are dropped once folded; the
reported OOD sets are quotes from the Debian ``fortunes`` package and Python standard-library docstrings
(``training.data.ood_texts``). Either: the OOD-validation families of ``training.data.ood_families``, and the post-hoc
path built from the same artifact module (``models.posthoc``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from artifact.contract import (
    ARTIFACT,
    TOKENIZER,
    ArtifactInfo,
    ImageConvert,
    ImageInput,
    Padding,
    TextInput,
    Truncation,
)
from artifact.formats import TORCHSCRIPT_FORMAT
from models.hybrid import hybrid_from_director
from models.posthoc import posthoc_from_director
from models.text_director import TextDirector
from training.config import USER_IMAGE_DATASET, PipelineConfig
from training.data.calibration_split import carve_calibration
from training.data.images import Dataset, Split, digits_images, uniform_noise_images
from training.data.ood_families import OodFamily, image_ood_families, text_ood_families
from training.data.tokens import TokenDataset, TokenSplit, text_ood_splits
from training.families.base import Family
from training.loading import AnySplit, Director, View
from training.posthoc.feature_statistics import attach_feature_scores
from training.posthoc.ood_selection import returns_input_scores, score_names
from training.posthoc.writing import script_and_verify


@dataclass
class ExportParts:
    """What export needs from a modality."""

    data: Dataset | TokenDataset
    backbone_logits: Callable[[AnySplit], torch.Tensor]  # a split -> the backbone's logits [N, C]
    build_artifact: Callable[[Director, Path], tuple[torch.nn.Module, torch.jit.ScriptModule]]  # -> (eager, served)
    # (the distilled DIRECTOR, its artifact module) -> the post-hoc path's module (``models.posthoc``)
    build_posthoc: Callable[[Director, torch.nn.Module], torch.nn.Module]
    # the same -> the hybrid path's module (``models.hybrid``): the backbone's forward, the kernel's error beside it
    build_hybrid: Callable[[Director, torch.nn.Module], torch.nn.Module]
    reported_ood: dict[str, AnySplit]
    ood_families: dict[str, OodFamily]  # the OOD-validation families that choose the served score
    input_section: ImageInput | TextInput
    signatures: dict[str, str]  # artifact "forward", "sample_rows" and "scored_rows"
    backbone_description: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)  # extra artifact files: name -> source
    # the share of validation carved off for prediction sets and abstentions only (``training.data.calibration_split``)
    calibration: AnySplit | None = None
    artifact_details: dict[str, Any] = field(default_factory=dict)


def with_teacher(director: Director, view: View) -> Director:
    """A frozen copy of ``director`` whose rollout carries the backbone's own last K transitions, so that its
    ``scored_rows`` returns the kernel error (and, once ``attach_feature_scores`` has run, the feature scores): OOD
    scores the exporter can choose."""
    scored = copy.deepcopy(director).eval().requires_grad_(False)
    scored.rollout.set_teacher(copy.deepcopy(view.teacher_steps(scored.rollout.num_steps)).requires_grad_(False))
    return scored


def backbone_path_builder(cfg: PipelineConfig, family: Family, backbone: torch.nn.Module, train: AnySplit,
                          num_classes: int, make: Callable[[torch.nn.Module], torch.nn.Module]
                          ) -> Callable[[Director, torch.nn.Module], torch.nn.Module]:
    """How a path on the backbone's own forward (``make``: the post-hoc path or the hybrid) is built from the DIRECTOR
    artifact module: its embedding, prefix, the backbone's own last transitions (and the kernel beside them), readout
    and feature scorer. A run that trained the readout with the kernel gets the backbone's own readout instead, with
    feature statistics fitted again on its features."""

    def build(director: Director, artifact_module: torch.nn.Module) -> torch.nn.Module:
        if not cfg.distil.finetune_readout:
            return make(artifact_module)
        view = family.view(backbone)
        own = family.artifact_module(with_teacher(family.director(view, director.rollout.kernel), view), cfg)
        if cfg.export.feature_scores:
            attach_feature_scores(own, train, num_classes, cfg.seed, cfg.export.knn_bank)
        return make(own)

    return build


def backbone_paths(cfg: PipelineConfig, family: Family, backbone: torch.nn.Module, data: Dataset | TokenDataset
                   ) -> dict[str, Callable[[Director, torch.nn.Module], torch.nn.Module]]:
    """``ExportParts``' builders of the post-hoc path and the hybrid."""
    return {f"build_{name}": backbone_path_builder(cfg, family, backbone, data.train, len(data.labels), make)
            for name, make in (("posthoc", posthoc_from_director), ("hybrid", hybrid_from_director))}


def image_export_parts(cfg: PipelineConfig, family: Family, backbone: torch.nn.Module) -> ExportParts:
    data, calibration = carve_calibration(family.load_data(cfg), cfg.export.calibration_share, cfg.seed)
    image_shape = tuple(int(s) for s in data.test.images.shape[1:])

    def build_artifact(director: Director, path: Path) -> tuple[torch.nn.Module, torch.jit.ScriptModule]:
        artifact_module = family.artifact_module(with_teacher(director, family.view(backbone)), cfg)
        if cfg.export.feature_scores:
            attach_feature_scores(artifact_module, data.train, len(data.labels), cfg.seed, cfg.export.knn_bank)
        return artifact_module, script_and_verify(artifact_module, director, data.val.first_args(8), path)

    labels = lambda n: torch.zeros(n, dtype=torch.long)  # noqa: E731
    count = cfg.evaluate.ood_images  # as many as the text sets (each a forward per image: ViT-B/16 at 224 is costly)
    noise = uniform_noise_images(count, image_shape, cfg.seed + 1)
    digits = digits_images(image_shape)[:count]
    return ExportParts(
        data=data,
        calibration=calibration,
        backbone_logits=lambda split: split.map(backbone, 512),
        build_artifact=build_artifact,
        **backbone_paths(cfg, family, backbone, data),
        reported_ood={"uniform_noise": Split(noise, labels(noise.shape[0])),
                      "sklearn_digits_upsampled": Split(digits, labels(digits.shape[0]))},
        ood_families=image_ood_families(cfg, data.val, image_shape),
        input_section=ImageInput(
            channels=image_shape[0], height=image_shape[1], width=image_shape[2], dtype="float32", range=(0.0, 1.0),
            layout="NCHW",
            convert=image_convert(cfg, image_shape[0])),
        signatures={"forward": "forward(pixels: Tensor[B, C, H, W] float32 in [0, 1], n_samples: int) "
                               "-> Tensor[n_samples, B, num_classes]",
                    "sample_rows": "sample_rows(pixels, repeats: Tensor[B] int64) "
                                   "-> Tensor[sum(repeats), num_classes]",
                    "scored_rows": "scored_rows(pixels, repeats: Tensor[B] int64) "
                                   "-> (Tensor[sum(repeats), num_classes], per-input scores Tensor[B, F] float32 "
                                   "in artifact.input_scores order)"},
        backbone_description=family.describe(backbone, cfg),
    )


def image_convert(cfg: PipelineConfig, channels: int) -> ImageConvert:
    """How the server turns an uploaded image into the artifact's pixels: the same conversion the data was read with."""
    color = "L" if channels == 1 else "RGB"
    if cfg.data.dataset == USER_IMAGE_DATASET:
        from training.data.sources import IMAGE_CONVERSION

        return ImageConvert(color=color, resize=IMAGE_CONVERSION, note="as the training images were read")
    return ImageConvert(color=color, resize="bilinear to height x width, aspect ratio not kept",
                        note="Fashion-MNIST convention: a light object on a dark background")


@torch.no_grad()
def table_effect(director: TextDirector, artifact_module: TextDirector, split: TokenSplit) -> dict[str, float]:
    """How much storing the word table and the layers in the artifact's dtypes moves the logits, with the noise off."""
    exact, stored = copy.deepcopy(director).eval(), copy.deepcopy(artifact_module).eval()
    exact.rollout.noise_scale.fill_(0.0)
    stored.rollout.noise_scale.fill_(0.0)
    a = split.map(lambda *args: exact(*args, 1)[0], 64)  # [N, C]
    b = split.map(lambda *args: stored(*args, 1)[0], 64)  # [N, C]
    return {"max_abs_logit_change_noise_off": float((a - b).abs().max()),
            "argmax_agreement_noise_off": float((a.argmax(-1) == b.argmax(-1)).float().mean()), "n": len(split)}


def text_export_parts(cfg: PipelineConfig, family: Family, backbone: torch.nn.Module) -> ExportParts:
    from training.data.tokens import TOKENIZER_FILE, load_run_tokenizer, pad_id

    tcfg, ecfg = cfg.text, cfg.export
    data, calibration = carve_calibration(family.load_data(cfg), ecfg.calibration_share, cfg.seed)
    tokenizer = load_run_tokenizer(cfg.run_dir)
    details: dict[str, Any] = {}

    def build_artifact(director: Director, path: Path) -> tuple[torch.nn.Module, torch.jit.ScriptModule]:
        artifact_module = family.artifact_module(with_teacher(director, family.view(backbone)), cfg)
        if ecfg.feature_scores:
            attach_feature_scores(artifact_module, data.train, len(data.labels), cfg.seed, ecfg.knn_bank)
        served = script_and_verify(artifact_module, artifact_module, data.val.first_args(8), path)
        table = artifact_module.embedding.word_table
        details["word_table"] = {
            "dtype": tcfg.table_dtype, "rows": int(table.shape[0]), "dim": int(table.shape[1]),
            "bytes": table.numel() * table.element_size() + artifact_module.embedding.word_scale.numel() * 4,
            "layer_dtype": tcfg.layer_dtype,  # the prefix's and the readout's linear layers
            **table_effect(director, artifact_module, data.val.head(ecfg.threshold_images))}
        return artifact_module, served

    reported_ood, licences = text_ood_splits(tokenizer, tcfg, cfg.evaluate.ood_images, ecfg.ood_validation_images,
                                             cfg.seed)
    return ExportParts(
        data=data,
        calibration=calibration,
        backbone_logits=lambda split: split.map(lambda *args: backbone(*args).float(), 256),
        build_artifact=build_artifact,
        **backbone_paths(cfg, family, backbone, data),
        reported_ood=reported_ood,
        ood_families=text_ood_families(cfg, tokenizer, licences),
        input_section=TextInput(
            tokenizer=TOKENIZER, max_length=tcfg.max_length, max_characters=tcfg.max_characters,
            truncation=Truncation(side="right",
                                  characters="a text is cut to its first max_characters characters before tokenising",
                                  tokens="tokenizer.json truncates to max_length tokens, special tokens included"),
            padding=Padding(side="right", pad_id=pad_id(tokenizer),
                            note="positions are absolute: pad on the right only; attention_mask is 1 for real tokens"),
            dtype="int64", fields=["input_ids", "attention_mask"]),
        signatures={"forward": "forward(input_ids: Tensor[B, L] int64, attention_mask: Tensor[B, L] int64, "
                               "n_samples: int) -> Tensor[n_samples, B, num_classes]",
                    "sample_rows": "sample_rows(input_ids, attention_mask, repeats: Tensor[B] int64) "
                                   "-> Tensor[sum(repeats), num_classes]",
                    "scored_rows": "scored_rows(input_ids, attention_mask, repeats: Tensor[B] int64) "
                                   "-> (Tensor[sum(repeats), num_classes], per-input scores Tensor[B, F] float32 "
                                   "in artifact.input_scores order)"},
        backbone_description=family.describe(backbone, cfg),
        files={TOKENIZER: Path(cfg.run_dir) / TOKENIZER_FILE},
        artifact_details=details,
    )


def export_parts(cfg: PipelineConfig, family: Family, backbone: torch.nn.Module) -> ExportParts:
    """What the backbone's family and modality contribute to an export of ``backbone``."""
    build = {"image": image_export_parts, "text": text_export_parts}[family.modality]
    return build(cfg, family, backbone)


def artifact_info(parts: ExportParts, module: torch.nn.Module) -> ArtifactInfo:
    """The manifest's ``artifact`` section: the file, its format and signatures, and the module's size."""
    scored = returns_input_scores(module)
    signatures = {k: v for k, v in parts.signatures.items() if k != "scored_rows" or scored}
    fields = {"file": ARTIFACT, "format": TORCHSCRIPT_FORMAT, "torch": torch.__version__, **signatures,
              "input_scores": list(score_names(module)) if scored else None,
              "parameters": sum(p.numel() for p in module.parameters())}
    return ArtifactInfo(**{**fields, **parts.artifact_details})  # a compiled package names its own file and format
