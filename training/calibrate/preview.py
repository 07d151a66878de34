"""The user's data read once before anything is trained: the summary printed with the plan, the inputs' size for the
estimates, and the label checks against the checkpoint's head (class count, and class names when the head has
none), so a mismatch is reported before a long run rather than after it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from training.config import USER_IMAGE_DATASET, USER_TEXT_DATASET, PipelineConfig
from training.data.calibration_split import calibration_line
from training.data.image_task import image_store
from training.data.sources import DataError, LabelLimit, check_class_count
from training.data.sources.summary import DataSummary
from training.families.checkpoint import Checkpoint, checkpoint_tokenizer

TEXT_INPUT_BYTES = 2 * 8  # ids and mask, int64 per token
# a built-in dataset's training and test sizes, for the estimates made before it is read
BUILT_IN_SIZES = {"cifar10": (50_000, 10_000), "cifar100": (50_000, 10_000), "fashion_mnist": (60_000, 10_000),
                  "cola": (8_551, 1_043), "imdb": (25_000, 25_000), "movie_reviews": (7_605, 2_000)}


@dataclass
class DataPreview:
    summary: str
    labels: list[str]
    train_inputs: int
    tokens: int  # per input
    input_bytes: int  # every split held in memory
    stored_bytes: int = 0  # the decoded inputs kept on disk instead (a user's images: ``ImageFile``)
    held_out: int = 0  # validation and test inputs
    typical_tokens: float | None = None  # texts: the length a length-bucketed batch pads to, about (None: tokens)
    val_inputs: int = 0  # validation inputs (tau's choice reads at most distil.tau_images of them)


def split_line(cfg: PipelineConfig, validation: int) -> str:
    """The plan's calibration-split line for this run's task."""
    return calibration_line(validation, cfg.export.calibration_share, cfg.task.multi_label)


def check_labels(checkpoint: Checkpoint, labels: list[str], named: bool) -> None:
    """The data's classes against the checkpoint's head: as many classes, and, when neither the head nor the config
    (``named``: ``data.labels``) names its classes, integer labels that are the head's indices."""
    if not checkpoint.has_head or checkpoint.num_classes is None:
        return
    check_class_count(labels, checkpoint.num_classes, checkpoint.source)
    if not named and labels != [str(i) for i in range(checkpoint.num_classes)]:
        raise DataError(f"{checkpoint.source}: its head does not name its classes (a timm head, or transformers' "
                        f"LABEL_0, LABEL_1, ...), so the data's labels must be its indices "
                        f"0..{checkpoint.num_classes - 1}, got {labels[:5]}; or name the classes in the head's order "
                        "with --set data.labels=[...]")


def label_limit(cfg: PipelineConfig, checkpoint: Checkpoint, column: str, hint: str) -> LabelLimit | None:
    """The most distinct labels the data may hold when they name its classes: the head's count, or
    ``data.max_classes`` without a head (none when ``data.labels`` names the classes: a label not among them is
    refused at its row)."""
    if cfg.data.labels:
        return None
    if checkpoint.has_head and checkpoint.num_classes is not None:
        return LabelLimit(checkpoint.num_classes, f"the checkpoint's head has {checkpoint.num_classes} classes",
                          column, hint)
    return LabelLimit(cfg.data.max_classes, f"at most data.max_classes = {cfg.data.max_classes} without a head; "
                      "--set data.max_classes=N allows more", column, hint)


def refuse_unread_texts(root: str, split: str, texts: list[str], tokenizer: Tokenizer) -> None:
    """Texts in which the tokenizer reads nothing but the special tokens it adds ([CLS] and [SEP], or none for a
    decoder's): the model would see the same input for each of them, whatever they say."""
    unread = [text for text, encoding in zip(texts, tokenizer.encode_batch(texts), strict=True)
              if not any(flag == 0 for flag in encoding.special_tokens_mask)]
    if unread:
        raise DataError(f"{root}: the checkpoint's tokenizer reads nothing but its special tokens in {len(unread)} "
                        f"{split} texts, e.g. {unread[0][:80]!r}; remove them or use the tokenizer the model was "
                        "trained with")


def typical_tokens(summary: DataSummary, max_length: int) -> float | None:
    """About the length a length-bucketed batch of these texts pads to: midway between the median and the 95th
    percentile of their token counts, at most ``max_length``."""
    lengths = summary.texts.tokens if summary.texts is not None else None
    return None if lengths is None else min(float(max_length), (lengths.median + lengths.p95) / 2)


def preview_data(cfg: PipelineConfig, checkpoint: Checkpoint) -> DataPreview:
    data = cfg.data
    labels = data.labels or None
    if data.dataset == USER_IMAGE_DATASET:
        from training.data.sources.multi_label_images import load_images

        channels, height, width = data.image_shape or (0, 0, 0)
        limit = None if cfg.task.multi_label else label_limit(cfg, checkpoint, "the class folders",
                                                              "; each class folder is a class")
        dataset, summary = load_images(Path(data.root), (channels, height, width), labels,
                                       (data.val_fraction, data.test_fraction), data.split_seed, image_store(cfg),
                                       limit, cfg.task.image_columns(data.label_column))
        inputs = len(dataset.train) + len(dataset.val) + len(dataset.test)
        patch = int(checkpoint.config.get("patch_size") or 16)
        tokens = (height // patch) * (width // patch) + 1
        batch = max(cfg.distil.batch_size, cfg.fit.batch_size, 256)  # rows read at once (a teacher chunk at most)
        preview = DataPreview(f"{summary.render()}\n{split_line(cfg, len(dataset.val))}",
                              dataset.labels, len(dataset.train), tokens,
                              batch * channels * height * width * 4, inputs * channels * height * width,
                              len(dataset.val) + len(dataset.test), val_inputs=len(dataset.val))
    elif data.dataset == USER_TEXT_DATASET:
        from training.data.sources import load_text_table

        tokenizer = checkpoint_tokenizer(checkpoint, cfg.text.max_length)
        tokenizer.no_truncation()
        tokenizer.no_padding()

        def count_tokens(texts: list[str]) -> list[int]:
            return [len(e.ids) for e in tokenizer.encode_batch(texts)]

        limit = None if cfg.task.multi_label else label_limit(
            cfg, checkpoint, f"the column {data.label_column!r}",
            f" Is {data.label_column!r} the labels' column? --label-column names it")
        texts, summary = load_text_table(data.root, data.text_column, data.label_column, labels, data.val_fraction,
                                         data.test_fraction, data.split_seed, cfg.text.max_characters, count_tokens,
                                         cfg.text.max_length, limit, cfg.task.multi_label,
                                         cfg.task.label_columns or None)
        for name, split in (("train", texts.train), ("val", texts.val), ("test", texts.test)):
            refuse_unread_texts(data.root, name, split.texts, tokenizer)
        inputs = len(texts.train) + len(texts.val) + len(texts.test)
        if checkpoint.max_positions is not None and cfg.text.max_length > checkpoint.max_positions:
            raise DataError(f"text.max_length {cfg.text.max_length} exceeds the checkpoint's "
                            f"{checkpoint.max_positions} positions: --set text.max_length={checkpoint.max_positions}")
        typical = typical_tokens(summary, cfg.text.max_length)
        preview = DataPreview(f"{summary.render()}\n{split_line(cfg, len(texts.val))}",
                              texts.labels, len(texts.train), cfg.text.max_length,
                              inputs * cfg.text.max_length * TEXT_INPUT_BYTES, 0, len(texts.val) + len(texts.test),
                              typical, val_inputs=len(texts.val))
    else:
        return built_in_preview(cfg, checkpoint)
    check_labels(checkpoint, preview.labels, bool(cfg.data.labels))
    return preview


def built_in_preview(cfg: PipelineConfig, checkpoint: Checkpoint) -> DataPreview:
    """A built-in dataset (the hub-backed configs in configs/calibrate/), read when the run starts: its usual sizes."""
    data = cfg.data
    train, test = BUILT_IN_SIZES.get(data.dataset, (50_000, 10_000))
    train = min(data.train_limit or train, train - data.val_size)
    inputs = train + data.val_size + min(data.test_limit or test, test)
    if checkpoint.family.modality == "image":
        channels, height, width = data.image_shape or checkpoint.image_shape or (3, 224, 224)
        patch = int(checkpoint.config.get("patch_size") or 16)
        tokens, per_input = (height // patch) * (width // patch) + 1, channels * height * width * 4
    else:
        tokens, per_input = cfg.text.max_length, cfg.text.max_length * TEXT_INPUT_BYTES
    return DataPreview(f"data: the built-in dataset {data.dataset!r} (read when the run starts; about {inputs} "
                       "inputs assumed for the estimates)", data.labels, train, tokens, inputs * per_input, 0,
                       inputs - train, val_inputs=data.val_size)
