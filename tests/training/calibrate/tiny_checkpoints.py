"""Tiny random-weight checkpoints of every supported family, saved as users keep them (``save_pretrained`` folders
with a tokenizer, or a timm weights file), and small labelled data sets for them: offline, in seconds."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    DeiTConfig,
    DeiTForImageClassificationWithTeacher,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
    ViTConfig,
    ViTForImageClassification,
    ViTModel,
)

from training.data.tokens import train_wordpiece

CLASSES = ["negative", "neutral", "positive"]
WORDS = {"negative": ["awful", "dull", "bad", "boring", "weak"], "neutral": ["plain", "okay", "fine", "average"],
         "positive": ["great", "superb", "good", "lovely", "fun"]}
FILLER = ["the", "film", "was", "a", "story", "and", "plot", "very", "quite", "really"]
TEXT = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
LABELS = dict(num_labels=3, id2label=dict(enumerate(CLASSES)), label2id={c: i for i, c in enumerate(CLASSES)})


def texts(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (text, label) rows: filler words around one or two words of the label's class."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = CLASSES[i % 3]
        words = rng.sample(FILLER, rng.randint(2, 6)) + rng.sample(WORDS[label], rng.randint(1, 2))
        rng.shuffle(words)
        rows.append((" ".join(words), label))
    return rows


def write_csv(path: Path, rows: list[tuple[str, str]], text_column: str = "text", label_column: str = "label") -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([text_column, label_column])
        writer.writerows(rows)
    return path


def save_tokenizer(folder: Path, special: bool = True) -> int:
    """A WordPiece tokenizer of the tiny texts' words, saved as a fast tokenizer, adding [CLS] and [SEP] (``special``:
    an encoder's) or nothing (a decoder's); returns its vocabulary size."""
    tokenizer = train_wordpiece([t for t, _ in texts(300, 0)], 100)
    if not special:
        tokenizer.post_processor = None
    wrapper = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]",
                                      cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    wrapper.save_pretrained(folder)
    return tokenizer.get_vocab_size()


def save_text_checkpoint(folder: Path, kind: str, head: bool = True, tokenizer: bool = True) -> Path:
    """A tiny ``kind`` (bert | roberta | distilbert | qwen2 | llama) classifier with the tiny tokenizer (or, not
    ``tokenizer``, with no tokenizer file at all, as a folder holding ``save_pretrained``'s model files alone)."""
    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = save_tokenizer(folder, special=kind not in ("qwen2", "llama")) if tokenizer else 0
    shape = {**TEXT, "vocab_size": max(vocab, TEXT["vocab_size"])}
    if kind == "bert":
        config = BertConfig(**shape, max_position_embeddings=64, **LABELS)
        model = BertForSequenceClassification(config) if head else BertModel(config)
    elif kind == "roberta":
        model = RobertaForSequenceClassification(RobertaConfig(**shape, max_position_embeddings=66, pad_token_id=0,
                                                               **LABELS))
    elif kind == "distilbert":
        model = DistilBertForSequenceClassification(DistilBertConfig(
            vocab_size=shape["vocab_size"], dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64,
            pad_token_id=0, **LABELS))
    elif kind == "qwen2":
        model = Qwen2ForSequenceClassification(Qwen2Config(**shape, num_key_value_heads=2, max_position_embeddings=64,
                                                           pad_token_id=0, **LABELS))
    elif kind == "llama":
        model = LlamaForSequenceClassification(LlamaConfig(**shape, num_key_value_heads=2, max_position_embeddings=64,
                                                           pad_token_id=0, attention_bias=False, **LABELS))
    else:
        raise ValueError(kind)
    model.save_pretrained(folder)
    return folder


def image(label: int, rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    """A noisy image whose dominant colour channel is its class."""
    pixels = rng.integers(0, 90, (size[1], size[0], 3), dtype=np.uint8)
    pixels[..., label] = rng.integers(150, 256, (size[1], size[0]), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


def write_image_folder(root: Path, per_class: int, seed: int = 0) -> Path:
    """``root/<class>/*.png|jpg`` of varying sizes, three colour classes."""
    rng = np.random.default_rng(seed)
    for label, name in enumerate(["red", "green", "blue"]):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            size = (int(rng.integers(12, 40)), int(rng.integers(12, 40)))
            image(label, rng, size).save(root / name / f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


def save_vit_checkpoint(folder: Path, kind: str = "vit", head: bool = True) -> Path:
    """A tiny ``kind`` (vit | deit: DeiT with its class and distillation heads) image classifier, or (vit, not
    ``head``) a bare ViT encoder, for which calibrate fits a head."""
    torch.manual_seed(0)
    shape = dict(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=64, num_labels=3,
                 id2label=dict(enumerate(["red", "green", "blue"])), label2id={"red": 0, "green": 1, "blue": 2})
    if kind == "vit":
        model = ViTForImageClassification(ViTConfig(**shape)) if head else ViTModel(ViTConfig(**shape))
    elif kind == "deit":
        model = DeiTForImageClassificationWithTeacher(DeiTConfig(**shape))
    else:
        raise ValueError(kind)
    model.save_pretrained(folder)
    return folder


TOPICS = ["negative", "neutral", "positive"]  # a multi-label tagger's labels: which kinds of words a text holds


def multi_label_texts(n: int, seed: int) -> list[tuple[str, list[str]]]:
    """``n`` (text, labels) rows: filler words around words of none, one, two or three of the topics."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        labels = [t for t in TOPICS if rng.random() < 0.4] if i % 7 else []
        words = rng.sample(FILLER, rng.randint(2, 5)) + [w for t in labels for w in rng.sample(WORDS[t], 1)]
        rng.shuffle(words)
        rows.append((" ".join(words), labels))
    return rows


def save_multi_label_checkpoint(folder: Path, kind: str = "bert") -> Path:
    """A tiny ``kind`` (bert | vit) classifier saved with ``problem_type: multi_label_classification``."""
    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    labels = dict(num_labels=3, id2label=dict(enumerate(TOPICS)), label2id={t: i for i, t in enumerate(TOPICS)},
                  problem_type="multi_label_classification")
    if kind == "bert":
        vocab = save_tokenizer(folder)
        model = BertForSequenceClassification(BertConfig(**{**TEXT, "vocab_size": max(vocab, TEXT["vocab_size"])},
                                                         max_position_embeddings=64, **labels))
    else:
        model = ViTForImageClassification(ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                                                    num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                                    **labels))
    model.save_pretrained(folder)
    return folder
