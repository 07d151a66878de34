"""Text inputs of the pipeline: the tokenizer (saved with the run, shipped in the artifact), tokenised splits,
length-bucketed training batches, length-sorted chunked inference, and the text OOD sets.

One tokenizer file serves every stage: ``fit-backbone`` writes ``<run_dir>/tokenizer.json`` (the model's own
``tokenizer.json`` for MiniLM, or a WordPiece vocabulary trained on the training texts for tiny test models) with
its truncation set to ``text.max_length`` and padding off; distil and export read it back and export copies it
next to ``director.ts``. A text is cut to ``text.max_characters`` characters before tokenising.
Batches are right-padded with the tokenizer's [PAD] id (BERT positions are absolute).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from training.config import USER_TEXT_DATASET, PipelineConfig, TextConfig
from training.data.images import ForwardArgs, Inputs
from training.data.texts import TextSplit

TOKENIZER_FILE = "tokenizer.json"
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_wordpiece(texts: list[str], vocab_size: int) -> Tokenizer:
    """A lower-cased BERT-style WordPiece tokenizer trained on ``texts`` ([CLS] text [SEP]; [PAD] is id 0)."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tokenizer


def build_tokenizer(tcfg: TextConfig, train_texts: list[str]) -> Tokenizer:
    """The run's tokenizer: ``text.tokenizer`` = minilm | wordpiece | a path to a tokenizer.json, with truncation
    at ``text.max_length`` tokens (special tokens included) and no padding (batches pad themselves)."""
    if tcfg.tokenizer == "minilm":
        from models.text_backbones import minilm_path

        tokenizer = Tokenizer.from_file(str(minilm_path() / TOKENIZER_FILE))
    elif tcfg.tokenizer == "wordpiece":
        tokenizer = train_wordpiece(train_texts, tcfg.vocab_size)
    else:
        tokenizer = Tokenizer.from_file(str(Path(tcfg.tokenizer)))
    tokenizer.no_padding()
    tokenizer.enable_truncation(tcfg.max_length, strategy="longest_first", direction="right")
    if tokenizer.token_to_id("[PAD]") is None:
        raise ValueError(f"tokenizer {tcfg.tokenizer!r} has no [PAD] token")
    return tokenizer


def load_run_tokenizer(run_dir: str | Path) -> Tokenizer:
    path = Path(run_dir) / TOKENIZER_FILE
    if not path.exists():
        raise FileNotFoundError(f"no {TOKENIZER_FILE} in {run_dir}: run `python -m training fit-backbone` first")
    return Tokenizer.from_file(str(path))


def pad_id(tokenizer: Tokenizer) -> int:
    """The id batches are right-padded with: the tokenizer file's own padding token (a pretrained checkpoint's, set
    by ``save_run_tokenizer``), else [PAD]."""
    padding = tokenizer.padding
    return int(padding["pad_id"]) if padding is not None else int(tokenizer.token_to_id("[PAD]"))


@dataclass
class TokenSplit(Inputs):
    """Tokenised texts: ids and attention mask [N, L] int64 (right-padded to the longest text), labels [N]. Chunks
    are cut by length (little padding) and each chunk is trimmed to its longest text."""

    ids: torch.Tensor
    mask: torch.Tensor
    labels: torch.Tensor
    texts: list[str]
    teacher_chunk: ClassVar[int] = 64  # the fp64 mixture variance of a chunk is [b, H, L, D]

    def __post_init__(self) -> None:
        if not (self.ids.shape == self.mask.shape and self.ids.shape[0] == self.labels.shape[0] == len(self.texts)):
            raise ValueError("ids, mask, labels and texts disagree in size")

    def forward_args(self, index: torch.Tensor) -> ForwardArgs:
        return self.rows(index)  # (ids [b, l], mask [b, l])

    @property
    def key_padding_mask(self) -> torch.Tensor:
        return self.mask.bool()  # [N, L]

    def order(self) -> torch.Tensor:
        return torch.argsort(self.lengths, stable=True)  # [N]

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(dim=1)  # [N]

    def head(self, n: int | None) -> TokenSplit:
        return self if n is None else self.subset(torch.arange(min(n, len(self))))

    def subset(self, index: torch.Tensor) -> TokenSplit:
        return TokenSplit(self.ids[index], self.mask[index], self.labels[index], [self.texts[int(i)] for i in index])

    def rows(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, mask) of rows ``index``, trimmed to the longest of them: [b, l] each."""
        mask = self.mask[index]  # [b, L]
        width = max(int(mask.sum(dim=1).max()), 1) if len(index) else 1
        return self.ids[index, :width], mask[:, :width]


@dataclass
class TokenDataset:
    train: TokenSplit
    val: TokenSplit
    test: TokenSplit
    labels: list[str]


def cut(text: str, max_characters: int) -> str:
    return text[:max_characters]


def encode(tokenizer: Tokenizer, texts: list[str], max_characters: int, labels: torch.Tensor | None = None,
           ) -> TokenSplit:
    """Tokenise (after cutting to ``max_characters``) and right-pad with [PAD] into a ``TokenSplit``; texts without
    labels get label 0."""
    encodings = tokenizer.encode_batch([cut(t, max_characters) for t in texts])
    lengths = [sum(e.attention_mask) for e in encodings]  # real tokens (a padding tokenizer pads on the right)
    if 0 in lengths:  # a tokenizer without special tokens (a decoder's) can read nothing in a text
        raise ValueError(f"the tokenizer reads no token in {lengths.count(0)} texts, e.g. "
                         f"{texts[lengths.index(0)][:80]!r}")
    width = max(lengths, default=1)
    ids = torch.full((len(texts), width), pad_id(tokenizer), dtype=torch.long)  # [N, L]
    mask = torch.zeros(len(texts), width, dtype=torch.long)  # [N, L]
    for i, (encoding, length) in enumerate(zip(encodings, lengths, strict=True)):
        ids[i, :length] = torch.tensor(encoding.ids[:length], dtype=torch.long)
        mask[i, :length] = 1
    if labels is None:
        labels = torch.zeros(len(texts), dtype=torch.long)
    return TokenSplit(ids, mask, labels, list(texts))


RawTextTask = tuple[TextSplit, TextSplit, TextSplit, list[str]]  # train, val, test, label names


def load_text_splits(dataset: str, val_size: int, split_seed: int, train_limit: int | None, test_limit: int | None,
                     data_cache: str | None, files: dict[str, str] | None = None) -> RawTextTask:
    """The raw text task of a built-in dataset: the VADER movie reviews (``training.data.texts``) or a hub task
    (``training.data.hub_text``, from local ``files`` when given): train / val / test ``TextSplit`` and the label
    names."""
    from training.data.hub_text import HUB_TEXT_TASKS, load_hub_text_task
    from training.data.texts import load_movie_reviews

    if dataset in HUB_TEXT_TASKS:
        data = load_hub_text_task(dataset, val_size, split_seed, train_limit, test_limit, files)
        return data.train, data.val, data.test, data.labels
    if dataset != "movie_reviews":
        raise ValueError(f"unknown text dataset {dataset!r}; expected movie_reviews or one of {sorted(HUB_TEXT_TASKS)}")
    data = load_movie_reviews(val_size=val_size, split_seed=split_seed, cache_dir=data_cache, train_limit=train_limit)
    return data.train, data.val, data.test.head(test_limit), data.labels


def raw_text_task(cfg: PipelineConfig) -> RawTextTask:
    """The raw text task a pipeline config names (``data.*``, ``text.data_cache``): a user's table
    (``data.dataset: table``; ``training.data.sources``) or a built-in dataset."""
    data = cfg.data
    if data.dataset == USER_TEXT_DATASET:
        from training.data.sources import load_text_table

        loaded, _ = load_text_table(data.root, data.text_column, data.label_column, data.labels or None,
                                    data.val_fraction, data.test_fraction, data.split_seed,
                                    multi_label=cfg.task.multi_label, label_columns=cfg.task.label_columns or None)
        return loaded.train.head(data.train_limit), loaded.val, loaded.test.head(data.test_limit), loaded.labels
    return load_text_splits(data.dataset, data.val_size, data.split_seed, data.train_limit, data.test_limit,
                            cfg.text.data_cache, data.files)


def tokenize_dataset(tokenizer: Tokenizer, tcfg: TextConfig, raw: RawTextTask) -> TokenDataset:
    train, val, test, labels = raw
    return TokenDataset(*(encode(tokenizer, s.texts, tcfg.max_characters, s.labels) for s in (train, val, test)),
                        labels=list(labels))


def bucketed_indices(lengths: torch.Tensor, batch_size: int, shuffle: bool, generator: torch.Generator | None = None,
                     rank: int = 0, world_size: int = 1, bucket: int = 1) -> list[torch.Tensor]:
    """One epoch's batches of row indices. With ``bucket`` > 1 the shuffled order is cut into windows of ``bucket``
    batches, each window sorted by length before it is cut into batches and the batches shuffled, so a batch holds
    texts of similar length (less padding); ``world_size`` > 1 shards by rank."""
    n = int(lengths.shape[0])
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    order = order[rank::world_size]
    groups: list[torch.Tensor] = []
    window = batch_size * max(bucket, 1)
    for start in range(0, len(order), window):
        chunk = order[start : start + window]
        if bucket > 1:
            chunk = chunk[torch.argsort(lengths[chunk], stable=True)]
        groups.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    if bucket > 1 and shuffle:
        groups = [groups[int(i)] for i in torch.randperm(len(groups), generator=generator)]
    return groups


def token_batches(split: TokenSplit, batch_size: int, shuffle: bool, generator: torch.Generator | None = None,
                  rank: int = 0, world_size: int = 1, bucket: int = 1
                  ) -> Iterator[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """Yield ((ids, mask), labels) mini-batches trimmed to their longest text, in ``bucketed_indices`` order."""
    for index in bucketed_indices(split.lengths, batch_size, shuffle, generator, rank, world_size, bucket):
        yield split.rows(index), split.labels[index]


@torch.inference_mode()
def sample_texts(texts: list[str], n: int, seed: int) -> list[str]:
    """``n`` texts drawn without replacement under ``seed`` (all of them when fewer)."""
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed))[:n]
    return [texts[int(i)] for i in order]


def readable(tokenizer: Tokenizer, texts: list[str]) -> list[str]:
    """The texts in which ``tokenizer`` reads at least one token (an OOD set's sentences are inputs only if the model
    can read them)."""
    return [t for t, e in zip(texts, tokenizer.encode_batch(texts), strict=True) if sum(e.attention_mask) > 0]


TEXT_OOD_SELECTION_SET = "sentences of the Debian software licences (OOD validation only)"


def text_ood_splits(tokenizer: Tokenizer, tcfg: TextConfig, reported: int, validation: int, seed: int
                    ) -> tuple[dict[str, TokenSplit], TokenSplit]:
    """The reported text OOD sets (``reported`` quotes of the Debian ``fortunes`` package and as many Python
    standard-library docstring sentences) and the OOD-validation set that picks the score (``validation`` sentences
    of the Debian software licences), tokenised."""
    from training.data.ood_texts import load_docstring_sentences, load_license_sentences
    from training.data.texts import load_fortunes

    reported_sets = {"fortunes_quotes": sample_texts(readable(tokenizer, load_fortunes()), reported, seed + 1),
                     "python_docstrings": sample_texts(readable(tokenizer, load_docstring_sentences()), reported,
                                                       seed + 2)}
    licences = sample_texts(readable(tokenizer, load_license_sentences()), validation, seed)
    return ({name: encode(tokenizer, texts, tcfg.max_characters) for name, texts in reported_sets.items()},
            encode(tokenizer, licences, tcfg.max_characters))
