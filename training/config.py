"""Typed pipeline configuration, read from the YAML files in ``configs/``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, TypeAdapter, ValidationError

from models.backbones import VitConfig
from training.task_config import TaskConfig

MODALITIES = ("image", "text")
HUB_TEXT_DATASETS = ("imdb", "cola")  # training.data.hub_text
USER_IMAGE_DATASET = "image_folder"  # a user's folder of images, one sub-folder per class (training.data.sources)
USER_TEXT_DATASET = "table"  # a user's CSV / JSONL / Parquet file, folder of them, or datasets folder / hub id
TEXT_DATASETS = ("movie_reviews", *HUB_TEXT_DATASETS, USER_TEXT_DATASET)
FIT_TRAIN = ("all", "head")
L2_TARGETS = ("labels", "teacher")
UNLABELED_CORPUS_NAMES = ("debian_descriptions",)  # training.data.unlabeled.UNLABELED_CORPORA
FORBID = ConfigDict(extra="forbid")  # every section refuses keys it does not have, naming them


@dataclass
class DataConfig:
    __pydantic_config__ = FORBID
    dataset: str = "fashion_mnist"  # image: fashion_mnist | cifar10 | cifar100; text: movie_reviews | imdb | cola
    root: str = "/usr/share/datasets/fashion-mnist"
    val_size: int = 6000
    split_seed: int = 0
    train_limit: int | None = None  # tiny configs in tests
    test_limit: int | None = None
    labels: list[str] = field(default_factory=list)
    # imdb / cola: local copies of the hub splits ({"train": file, "test": file}; parquet, jsonl or csv), else the hub
    files: dict[str, str] | None = None
    # a user's data (image_folder | table at root): columns, val / test fractions carved if absent, image [C, H, W]
    text_column: str = "text"
    label_column: str = "label"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    image_shape: list[int] | None = None
    max_classes: int = 10_000  # a user's data without a head fixing its classes: more distinct labels are refused


@dataclass
class PretrainedConfig:
    """A user's pretrained classifier (``python -m training calibrate``): ``source`` is a Hugging Face checkpoint
    folder or hub id, or ``timm:<model name>`` with ``checkpoint`` its weights file. None: the pipeline fits its own
    backbone (the built-in tasks)."""
    __pydantic_config__ = FORBID

    source: str | None = None
    checkpoint: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)  # timm.create_model's keyword arguments (other sizes)


@dataclass
class FitConfig:
    __pydantic_config__ = FORBID
    epochs: int = 10
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 0.5
    label_smoothing: float = 0.0
    augment: bool = True
    max_steps: int | None = None
    grad_clip: float | None = None  # max gradient norm (None: no clipping)
    train: str = "all"  # fit-backbone trains the whole backbone, or the head alone on the frozen body (no head)


@dataclass
class DistilKernelConfig:
    __pydantic_config__ = FORBID
    mlp_ratio: float = 1.0
    frequency_embedding_size: int = 64


@dataclass
class DistilConfig:
    __pydantic_config__ = FORBID
    # K, the transitions the kernel diffuses: the first T - K run as the real layers once per input (partial depth,
    # docs/method.md); None = the whole stack (K = T)
    depth: int | None = None
    # calibrate: the depths compared on validation NLL, each distilled probe_epochs and only the best to the end (and
    # exported; probe_epochs null: each to the end, docs/your-own-model.md "Choosing K"); empty: depth alone
    depth_candidates: list[int] = field(default_factory=list)
    probe_epochs: int | None = 1
    epochs: int = 4
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 100
    lambda_1: float = 0.8
    lambda_2: float = 0.2
    beta_nll: float = 0.5  # 0 = plain KL
    mean_mse_weight: float = 0.0
    l1_on_rollout: bool = False
    train_samples: int = 1  # rollouts per input for L2
    # L2's target: the labels, or the frozen backbone's predictive distribution on the same input (knowledge
    # distillation: the kernel cannot fit the training labels beyond what its teacher does; small datasets)
    l2_target: str = "labels"  # labels | teacher
    observed_variance: str = "attention"  # attention | floor
    floor_fraction: float = 1e-4
    tau: float | None = None  # None: select on validation from tau_grid
    tau_grid: list[float] = field(default_factory=lambda: [1.0, 0.3, 0.1, 0.03])
    tau_tolerance: float = 0.01
    tau_images: int = 2000
    stats_batches: int = 20
    finetune_readout: bool = False
    # perturbed copies of the training inputs distilled against the teacher's outputs (needs l2_target teacher)
    unlabeled_copies: int = 0
    # text models: an unlabeled corpus distilled the same way (a name in training.data.unlabeled.UNLABELED_CORPORA)
    unlabeled_corpus: str | None = None
    ema_decay: float = 0.0  # EMA of the kernel's (and readout's) weights, validated and kept; 0 = none
    keep_best: bool = True  # keep the epoch with the best validation NLL (False: the last epoch)
    val_samples: int = 8
    val_images: int = 2000
    max_steps: int | None = None
    # the cached start states X_{T-K} past this many bytes (float32) go to a file in half precision under the run
    start_states_memory_bytes: int | None = 4 * 2**30
    kernel: DistilKernelConfig = field(default_factory=DistilKernelConfig)


@dataclass
class ExportConfig:
    __pydantic_config__ = FORBID
    name: str = "fashion-vit"
    version: int = 1
    repository: str = "model_repository"
    default_samples: int | None = 16  # None: the smallest S whose validation NLL is within noise of the reference's
    default_samples_reference: int = 32
    temperature_scaling: bool = True  # serve a temperature on the sampled logits when it wins on held-out validation
    max_samples: int = 64
    sample_counts: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    threshold_images: int = 2000
    ood_validation_images: int = 2000
    # a user's OOD-validation set (images folder or a text file, one input per line: training.data.ood_validation):
    # one more family beside the built-in ones that choose the served score, its regret weighted by the weight below
    ood_validation_data: str | None = None
    ood_validation_weight: float = 1.0
    # what the version serves: DIRECTOR, the hybrid (the backbone's logits, the kernel's error beside them), the
    # post-hoc path (the backbone's logits, same post-hoc tools), or auto: the three-way verdict (export.verdict)
    method: Literal["auto", "director", "hybrid", "posthoc"] = "auto"
    # the practical size of a difference, gain or loss: ECE, AUROC, FPR95 absolute, NLL relative to the post-hoc path's
    verdict_ece: float = 0.01
    verdict_nll_relative: float = 0.02
    verdict_auroc: float = 0.01
    verdict_fpr95: float = 0.05
    verdict_bootstrap: int = 200  # paired bootstrap resamples for the ECE and AUROC intervals
    noise_scale_grid: list[float] = field(default_factory=lambda: [1.0])
    # the share of each sample's noise drawn once for every token (models.director.StochasticRollout); several values:
    # fitted with the noise temperature on validation and a held-out shift of it (images)
    noise_correlation_grid: list[float] = field(default_factory=lambda: [0.0])
    # a temperature per input that grows with the served OOD score (models.uncertainty.ScoreTemperature): more than
    # one slope is fitted on validation and a held-out shift of it; [0.0]: one temperature for every input
    temperature_slope_grid: list[float] = field(default_factory=lambda: [0.0])
    docs_dir: str = "docs/results"
    # the feature-space OOD scores' statistics (models.feature_scores) in the artifact; knn_bank: KNN's features kept
    feature_scores: bool = True
    knn_bank: int = 10_000
    # "aoti": also compile with torch.export + AOTInductor into director.pt2 (artifact.formats) and serve that; needs a
    # C++ compiler at export; on CPU it answers fewer requests than TorchScript (docs/benchmarks-overhead.md)
    format: Literal["torchscript", "aoti"] = "torchscript"
    # sets and abstentions (docs/method.md, "Acting on uncertainty"): the share of validation carved off to calibrate
    # them alone (0: none), their scores (the first is the default), RAPS's penalty and free ranks, LTT's delta
    calibration_share: float = 0.25
    conformal_scores: list[Literal["lac", "aps", "raps"]] = field(default_factory=lambda: ["lac", "aps", "raps"])
    raps_penalty: float = 0.01
    raps_free_ranks: int = 1
    selective_delta: float = 0.1


@dataclass
class EvaluateConfig:
    """The evaluation table: methods, shift, OOD sets, ablations. Trained baselines and ablation
    kernels are cached under ``<run_dir>/baselines`` and ``<run_dir>/ablations``; logits under ``<run_dir>/eval``."""
    __pydantic_config__ = FORBID

    task: str = "fashion-mnist"
    stages: list[str] = field(default_factory=lambda: ["test_and_ood", "detectors", "shift", "decisions", "sweep",
                                                       "cost", "ablations", "variance", "kernel_depth"])
    ensemble_members: int = 3  # member 0 is the pipeline's own backbone
    samples: int = 16  # S for MC dropout and DIRECTOR
    sweep_samples: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    noise_scale_grid: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0, 1.5])
    # the shift-fitted noise (training.posthoc.served_statistics.fit_noise_shape): token correlation x noise
    # temperature chosen on validation and a held-out shift of it; an empty correlation grid leaves that method out
    noise_correlation_grid: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0])
    shift_noise_scale_grid: list[float] = field(default_factory=lambda: [0.5, 1.0, 1.5, 2.0, 3.0])
    noise_fit_images: int = 1000
    # an exported version of this run (model_repository/<export.name>/<version>) also evaluated as it serves by
    # default: the row "DIRECTOR as served", or "Post-hoc as served" for a version that serves the post-hoc path
    served_version: int | None = None
    corruption_images: int = 2000
    shift_texts: int | None = None  # texts per shifted domain (drawn under the seed); None: all of them
    # texts: shifted domains (training.data.texts.SHIFT_CORPORA) also reported as OOD sets, `ood_images` texts each,
    # so every score and detector is measured on telling them from the test split (never selected or fitted on)
    shifted_domains_as_ood: list[str] = field(default_factory=list)
    corruptions: list[str] = field(default_factory=list)  # empty: all of training.data.corruptions.CORRUPTIONS
    severities: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    ood_images: int = 1000
    ablations: list[str] = field(default_factory=lambda: ["both", "floor", "l1_only", "l2_only",
                                                          "tau_1.0", "tau_0.1", "tau_0.03"])
    ablation_epochs: int = 2
    ablation_inputs: int | None = None  # first N test inputs for the ablation rows (None: the whole split)
    distil_seeds: list[int] = field(default_factory=lambda: [1, 2])  # extra seeds beside cfg.seed, full recipe
    # the kernel error over K diffused steps against the run's own K (``training.evaluate.kernel_depth``): each K
    # distilled for ``kernel_depth_epochs`` on the main run's backbone; a K beyond the backbone's depth is skipped
    kernel_error_depths: list[int] = field(default_factory=lambda: [2, 3])
    kernel_depth_epochs: int = 3
    latency_images: int = 64
    latency_repeats: int = 3
    bootstrap: int = 200
    rows_per_forward: int = 256


@dataclass
class KepSvgpConfig:
    """The KEP-SVGP baseline (``training.baselines.kep_svgp``): the backbone's last ``layers`` attention layers replaced
    by KEP-SVGP attention with ``rank`` eigen-pairs per head, fine-tuned from the fitted backbone with
    ``CE + kl_weight * KL + ksvd_weight * KSVD`` (the authors' weights: 1 and 1 for the summed SVGP pair). Cached
    under ``<run_dir>/baselines/kep_svgp``."""
    __pydantic_config__ = FORBID

    layers: int = 1
    rank: int = 10
    rank_multi: int = 10  # W_e, W_r combine min(N, rank * rank_multi) tokens
    epochs: int = 3
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 5e-5
    warmup_steps: int = 100
    kl_weight: float = 1.0
    ksvd_weight: float = 1.0
    train_prefix: bool = False  # False: the embedding and the first T - L layers stay frozen
    augment: bool = True
    max_steps: int | None = None
    val_images: int = 2000
    val_samples: int = 8
    # the evaluation's ``kep_svgp`` row (fine-tuned first when the run has none yet)
    in_evaluation: bool = False


@dataclass
class TinyBertConfig:
    """A randomly initialised small BERT (``text.backbone: tiny``; tests and smoke runs)."""
    __pydantic_config__ = FORBID

    hidden_size: int = 32
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 64


@dataclass
class TextConfig:
    """Text models (``modality: text``): a BERT-family encoder fine-tuned with a classification head.

    ``tokenizer``: ``minilm`` (the pretrained model's own tokenizer.json), ``wordpiece`` (a WordPiece vocabulary of
    ``vocab_size`` trained on the training texts; with the tiny backbone) or a path to a tokenizer.json. Texts are cut
    to ``max_characters`` characters, then truncated to ``max_length`` tokens ([CLS] and [SEP] included).
    ``table_dtype``: how the artifact stores the word-embedding table (float32 | float16 | int8 with per-row scales).
    ``bucket``: training batches are drawn from windows of this many batches sorted by length (1: no bucketing).
    ``data_cache``: where the VADER corpus is cached (None: DIRECTOR_DATA_CACHE or ~/.cache/director).
    """
    __pydantic_config__ = FORBID

    backbone: str = "minilm"  # minilm | tiny | pretrained (the checkpoint of ``pretrained.source``)
    tokenizer: str = "minilm"  # minilm | wordpiece | pretrained | path/to/tokenizer.json
    vocab_size: int = 1000  # wordpiece only
    max_length: int = 64
    max_characters: int = 1000
    pooling: str = "mean"  # mean | cls
    dropout: float = 0.1
    table_dtype: str = "int8"  # float32 | float16 | int8
    layer_dtype: str = "float32"  # float32 | float16: how the artifact stores the prefix's and readout's linear layers
    bucket: int = 20
    data_cache: str | None = None
    tiny: TinyBertConfig = field(default_factory=TinyBertConfig)


@dataclass
class PipelineConfig:
    __pydantic_config__ = FORBID
    name: str = "fashion-vit"
    seed: int = 0
    modality: str = "image"  # image | text
    run_dir: str = "runs/fashion-vit"
    device: str = "auto"
    bf16: bool = False  # bf16 autocast of the training forwards on CUDA (ignored on the CPU)
    threads: int | None = None
    data: DataConfig = field(default_factory=DataConfig)
    pretrained: PretrainedConfig = field(default_factory=PretrainedConfig)
    backbone: VitConfig = field(default_factory=VitConfig)
    fit: FitConfig = field(default_factory=FitConfig)
    distil: DistilConfig = field(default_factory=DistilConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    kep_svgp: KepSvgpConfig = field(default_factory=KepSvgpConfig)
    text: TextConfig = field(default_factory=TextConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    source: str = ""

    @property
    def is_text(self) -> bool:
        return self.modality == "text"


def validated(raw: dict[str, Any]) -> PipelineConfig:
    """The config's dict as typed sections: an unknown key or a wrongly typed value is a ValueError naming each."""
    try:
        return TypeAdapter(PipelineConfig).validate_python(raw)
    except ValidationError as exc:
        problems = [f"{'.'.join(map(str, error['loc']))}: {error['msg']}" for error in exc.errors()]
        raise ValueError("config: " + "; ".join(problems)) from exc


def set_overrides(pairs: list[str]) -> dict[str, Any]:
    """The command line's ``--set key=value`` pairs as ``load_config`` overrides (values read as YAML)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Read a YAML config; ``overrides`` maps dotted keys (``distil.epochs``) to values."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    for dotted, value in (overrides or {}).items():
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    cfg = validated(raw)
    cfg.source = str(path)
    check_config(cfg)
    return cfg


def check_config(cfg: PipelineConfig) -> None:
    """Refuse settings that cannot work together, naming the key."""
    if cfg.distil.l2_target not in L2_TARGETS:
        raise ValueError(f"distil.l2_target must be one of {L2_TARGETS}, got {cfg.distil.l2_target!r}")
    if cfg.distil.depth is not None and cfg.distil.depth < 1:
        raise ValueError(f"distil.depth must be >= 1 (or null for the whole stack), got {cfg.distil.depth}")
    if cfg.distil.unlabeled_copies > 0 and cfg.distil.l2_target != "teacher":
        raise ValueError("distil.unlabeled_copies needs distil.l2_target: teacher (the copies have no labels)")
    if cfg.distil.unlabeled_corpus is not None:
        if cfg.distil.unlabeled_corpus not in UNLABELED_CORPUS_NAMES:
            raise ValueError(f"distil.unlabeled_corpus must be one of {UNLABELED_CORPUS_NAMES}, "
                             f"got {cfg.distil.unlabeled_corpus!r}")
        if cfg.modality != "text" or cfg.distil.l2_target != "teacher":
            raise ValueError("distil.unlabeled_corpus is text for a text model and needs distil.l2_target: teacher")
    if not 0.0 <= cfg.distil.ema_decay < 1.0:
        raise ValueError(f"distil.ema_decay must be in [0, 1), got {cfg.distil.ema_decay}")
    if cfg.modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES}, got {cfg.modality!r}")
    if cfg.fit.train not in FIT_TRAIN:
        raise ValueError(f"fit.train must be one of {FIT_TRAIN}, got {cfg.fit.train!r}")
    if cfg.is_text and (cfg.pretrained.source is not None) != (cfg.text.backbone == "pretrained"):
        raise ValueError("a text model with pretrained.source has text.backbone: pretrained, and only then")
    if not (0.0 <= cfg.data.val_fraction < 1.0 and 0.0 <= cfg.data.test_fraction < 1.0
            and cfg.data.val_fraction + cfg.data.test_fraction < 1.0):
        raise ValueError("data.val_fraction and data.test_fraction must each be in [0, 1) and sum to less than 1")
    if cfg.data.dataset == USER_IMAGE_DATASET and (cfg.data.image_shape is None or len(cfg.data.image_shape) != 3):
        raise ValueError("data.dataset image_folder needs data.image_shape [channels, height, width]")
    if cfg.data.files is not None and cfg.data.dataset not in HUB_TEXT_DATASETS:
        raise ValueError(f"data.files are local copies of a hub task {HUB_TEXT_DATASETS}; "
                         f"{cfg.data.dataset} does not read them")
    if cfg.is_text:
        text = cfg.text
        if cfg.data.dataset not in TEXT_DATASETS:
            raise ValueError(f"data.dataset for modality text must be one of {TEXT_DATASETS}, got {cfg.data.dataset!r}")
        if text.backbone not in ("minilm", "tiny", "pretrained"):
            raise ValueError(f"text.backbone must be minilm, tiny or pretrained, got {text.backbone!r}")
        if text.backbone == "minilm" and text.tokenizer != "minilm":
            raise ValueError("text.backbone minilm needs its own tokenizer (text.tokenizer: minilm)")
        if (text.backbone == "pretrained") != (text.tokenizer == "pretrained"):
            raise ValueError("text.backbone pretrained and text.tokenizer pretrained go together "
                             "(the checkpoint's own tokenizer)")
        if text.pooling not in ("mean", "cls"):
            raise ValueError(f"text.pooling must be mean or cls, got {text.pooling!r}")
        if text.table_dtype not in ("float32", "float16", "int8"):
            raise ValueError(f"text.table_dtype must be float32, float16 or int8, got {text.table_dtype!r}")
        if text.layer_dtype not in ("float32", "float16"):
            raise ValueError(f"text.layer_dtype must be float32 or float16, got {text.layer_dtype!r}")
        if text.max_length < 2 or text.max_characters < 1:
            raise ValueError("text.max_length must be >= 2 and text.max_characters >= 1")


def config_dict(cfg: PipelineConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
