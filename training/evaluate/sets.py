"""The input sets of an evaluation, per modality: validation and test splits, the reported OOD sets, the
OOD-validation families (score choice only) and the shifted sets, all as splits (``Split`` of images or
``TokenSplit`` of tokenised texts) so the evaluation samples and scores them alike.

Images (Fashion-MNIST): OOD uniform noise, upsampled sklearn digits and rendered letters; shift the corrupted test
subsets (type x severity). Texts (movie reviews): OOD quotes of the Debian ``fortunes`` package and Python
standard-library docstrings; shift the tweets, NYT editorial and Amazon review sentences of the same corpus (one level
each: a domain, not a severity), and those named in ``evaluate.shifted_domains_as_ood`` also as OOD sets (can a score
tell the domain from the test split?). Either: the OOD-validation families that choose every method's score are the
export's own (``training.data.ood_families``), a user's OOD-validation set among them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from training.config import PipelineConfig
from training.data.calibration_split import carve_calibration
from training.data.corruptions import CORRUPTIONS, corrupt, corruption_seed, corruption_subset
from training.data.images import (
    Dataset,
    ForwardArgs,
    Split,
    digits_images,
    letter_images,
    uniform_noise_images,
)
from training.data.ood_families import OodFamily, image_ood_families, text_ood_families, unlabelled
from training.data.tokens import (
    TokenDataset,
    TokenSplit,
    encode,
    load_run_tokenizer,
    sample_texts,
    text_ood_splits,
)
from training.loading import AnySplit, load_data


@dataclass(frozen=True)
class ShiftSet:
    group: str  # corruption type or text domain
    level: int | None  # corruption severity; None for a domain
    set_name: str  # logit-cache key
    split: AnySplit


@dataclass
class EvalInputs:
    train: AnySplit  # fits the feature-space statistics only
    val: AnySplit
    test: AnySplit
    ood: dict[str, AnySplit]  # reported OOD sets
    ood_families: dict[str, OodFamily]  # the OOD-validation families that pick each method's OOD score
    unit: str  # "images" | "texts"
    calibration: AnySplit | None = None  # the export's calibration split: the decisions stage's only fit

    def singles(self, split: AnySplit, n: int) -> list[ForwardArgs]:
        """The first ``n`` inputs of ``split``, each as a batch of one."""
        return [split.forward_args(torch.tensor([i])) for i in range(min(n, len(split)))]


def image_eval_inputs(cfg: PipelineConfig, data: Dataset | TokenDataset) -> EvalInputs:
    ev, seed = cfg.evaluate, cfg.seed
    assert isinstance(data, Dataset)
    shape = tuple(int(s) for s in data.test.images.shape[1:])
    ood = {"uniform_noise": unlabelled(uniform_noise_images(ev.ood_images, shape, seed + 1)),
           "sklearn_digits": unlabelled(digits_images(shape)[: ev.ood_images]),
           "letters": unlabelled(letter_images(ev.ood_images, shape, seed + 2))}
    families = image_ood_families(cfg, data.val, shape)
    return EvalInputs(data.train, data.val, data.test, ood, families, "images")


def text_eval_inputs(cfg: PipelineConfig, data: Dataset | TokenDataset) -> EvalInputs:
    tokenizer = load_run_tokenizer(cfg.run_dir)
    ood, licences = text_ood_splits(tokenizer, cfg.text, cfg.evaluate.ood_images, cfg.export.ood_validation_images,
                                    cfg.seed)
    families = text_ood_families(cfg, tokenizer, licences)
    return EvalInputs(data.train, data.val, data.test, {**ood, **shifted_domains_as_ood(cfg)}, families, "texts")


def shifted_domains_as_ood(cfg: PipelineConfig) -> dict[str, TokenSplit]:
    """``evaluate.shifted_domains_as_ood``: each named shifted domain as an OOD set of ``evaluate.ood_images`` texts
    (drawn under the seed, labels dropped), named ``shifted_<domain>``."""
    from training.data.texts import SHIFT_CORPORA, load_shift_sets

    names = cfg.evaluate.shifted_domains_as_ood
    unknown = sorted(set(names) - set(SHIFT_CORPORA))
    if unknown:
        raise ValueError(f"evaluate.shifted_domains_as_ood: unknown domain(s) {unknown}; expected {SHIFT_CORPORA}")
    if not names:
        return {}
    tokenizer = load_run_tokenizer(cfg.run_dir)
    domains = load_shift_sets(cfg.text.data_cache)
    out = {}
    for name in names:
        texts = sample_texts(domains[name].texts, cfg.evaluate.ood_images, cfg.seed + 3)
        out[f"shifted_{name}"] = encode(tokenizer, texts, cfg.text.max_characters)
    return out


def image_shift_sets(cfg: PipelineConfig, inputs: EvalInputs) -> list[ShiftSet]:
    """Corrupted test subsets: a fixed subset, the same for every type and severity."""
    ev, test = cfg.evaluate, inputs.test
    assert isinstance(test, Split)
    index = corruption_subset(len(test), min(ev.corruption_images, len(test)), seed=cfg.seed)
    clean, labels = test.images[index], test.labels[index]
    out = []
    for name in ev.corruptions or list(CORRUPTIONS):
        for severity in ev.severities:
            images = corrupt(clean, name, severity, corruption_seed(name, severity, cfg.seed))
            out.append(ShiftSet(name, severity, f"c-{name}-{severity}-n{len(index)}", Split(images, labels)))
    return out


def text_shift_sets(cfg: PipelineConfig, inputs: EvalInputs) -> list[ShiftSet]:
    """The shifted text domains, each cut to ``evaluate.shift_texts`` sentences drawn under the seed, when set."""
    from training.data.hub_text import HUB_TEXT_TASKS
    from training.data.texts import load_shift_sets

    ev = cfg.evaluate
    task = HUB_TEXT_TASKS.get(cfg.data.dataset)
    if cfg.data.dataset != "movie_reviews" and (task is None or not task.sentiment):
        raise ValueError(f"the text shift sets are labelled by sentiment and do not apply to {cfg.data.dataset}: "
                         "leave `shift` out of evaluate.stages")
    tokenizer = load_run_tokenizer(cfg.run_dir)
    out = []
    for name, domain in load_shift_sets(cfg.text.data_cache).items():
        if ev.shift_texts is not None and ev.shift_texts < len(domain):
            order = torch.randperm(len(domain), generator=torch.Generator().manual_seed(cfg.seed))
            domain = domain.subset(torch.sort(order[: ev.shift_texts]).values)
        split = encode(tokenizer, domain.texts, cfg.text.max_characters, domain.labels)
        out.append(ShiftSet(name, None, f"shift-{name}-n{len(split)}", split))
    return out


@dataclass(frozen=True)
class EvalSets:
    """What the evaluation reads for one modality."""

    inputs: Callable[[PipelineConfig, Dataset | TokenDataset], EvalInputs]
    shift: Callable[[PipelineConfig, EvalInputs], list[ShiftSet]]


EVAL_SETS = {"image": EvalSets(image_eval_inputs, image_shift_sets),
             "text": EvalSets(text_eval_inputs, text_shift_sets)}


def load_eval_inputs(cfg: PipelineConfig) -> EvalInputs:
    """The sets, validation without the calibration split the export carves off (``training.data.calibration_split``),
    so that every fit here sees the validation inputs the export's fits saw; the calibration split is kept apart for
    the prediction sets and abstentions (``training.evaluate.decisions``)."""
    data, calibration = carve_calibration(load_data(cfg), cfg.export.calibration_share, cfg.seed)
    inputs = EVAL_SETS[cfg.modality].inputs(cfg, data)
    inputs.calibration = calibration
    return inputs


def shift_sets(cfg: PipelineConfig, inputs: EvalInputs) -> list[ShiftSet]:
    """Corrupted test subsets (images) or the shifted text domains (texts)."""
    return EVAL_SETS[cfg.modality].shift(cfg, inputs)
