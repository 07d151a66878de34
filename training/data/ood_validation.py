"""The OOD-validation set a user names (``export.ood_validation_data``): the inputs that choose the served OOD score,
its combination weights and nothing else (docs/method.md, "The served score on shifted editorials").

The built-in sets (sklearn photo patches for images, Debian licence sentences for texts) are far from any task, so the
score they choose separates far-off inputs best. A team that fears a nearer kind (another register of its own domain,
a neighbouring product's images) can name a sample of it instead: a folder of PNG or JPEG images (read as the server
reads an uploaded image, any size or colour mode) or a UTF-8 text file with one input per line. It must share nothing
with the sets the team reports results on, or the choice is made on what it then measures.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer

from training.data.images import Split
from training.data.sources.errors import DataError
from training.data.sources.folders import entries
from training.data.sources.images import read_image
from training.data.tokens import TokenSplit, encode, readable, sample_texts

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}


def describe(path: str | Path) -> str:
    """How the manifest and the pages name a user's OOD-validation set."""
    return f"{Path(path).name} (the user's OOD validation set, used for nothing else)"


def image_files(folder: Path) -> list[Path]:
    """The PNG and JPEG files under ``folder``, in every subfolder, in name order (hidden entries left out)."""
    if not folder.is_dir():
        raise DataError(f"export.ood_validation_data: {folder} is not a folder of images")
    found = []
    for entry in entries(folder):
        if entry.is_dir():
            found += image_files(entry)
        elif entry.suffix.lower() in IMAGE_SUFFIXES:
            found.append(entry)
    return found


def user_ood_images(folder: str | Path, limit: int, shape: tuple[int, int, int], seed: int) -> Split:
    """At most ``limit`` images of ``folder`` (drawn under ``seed`` when there are more) as the model's inputs
    [N, C, H, W]."""
    paths = image_files(Path(folder))
    if not paths:
        raise DataError(f"export.ood_validation_data: no PNG or JPEG file under {folder}")
    if len(paths) > limit:
        keep = torch.randperm(len(paths), generator=torch.Generator().manual_seed(seed))[:limit]
        paths = [paths[i] for i in sorted(keep.tolist())]
    images = torch.stack([read_image(p, *shape)[0] for p in paths])  # [N, C, H, W]
    return Split(images, torch.zeros(len(paths), dtype=torch.long))


def user_ood_texts(path: str | Path, limit: int, tokenizer: Tokenizer, max_characters: int, seed: int) -> TokenSplit:
    """At most ``limit`` non-empty lines of the text file ``path`` that the tokenizer reads (drawn under ``seed``),
    tokenised."""
    file = Path(path)
    try:
        lines = [line.strip() for line in file.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"export.ood_validation_data: {file} is not a readable UTF-8 text file ({exc})") from exc
    texts = readable(tokenizer, [line for line in lines if line])
    if not texts:
        raise DataError(f"export.ood_validation_data: {file} has no line the model's tokenizer reads")
    return encode(tokenizer, sample_texts(texts, limit, seed), max_characters)
