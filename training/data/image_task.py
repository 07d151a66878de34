"""The image task a config names: a built-in dataset (``training.data.images``) or a user's image folder
(``training.data.sources``), as one ``Dataset``."""

from __future__ import annotations

from pathlib import Path

from training.config import USER_IMAGE_DATASET, PipelineConfig
from training.data.images import Dataset, Split, load_dataset, resized
from training.data.sources.multi_label_images import load_images


def load_image_dataset(cfg: PipelineConfig) -> Dataset:
    """The image task a config names: a user's image folder (``data.dataset: image_folder``, converted to
    ``data.image_shape`` as the server will convert uploads; ``training.data.sources``) or a built-in dataset."""
    data = cfg.data
    if data.dataset != USER_IMAGE_DATASET:
        loaded = load_dataset(data.dataset, data.root, data.val_size, data.split_seed, data.train_limit,
                              data.test_limit)
        if data.image_shape is None:
            return loaded
        size = tuple(data.image_shape[1:])
        return Dataset(*(Split(resized(s.images, size), s.labels) for s in (loaded.train, loaded.val, loaded.test)),
                       labels=loaded.labels)
    channels, height, width = data.image_shape or (0, 0, 0)
    loaded, _ = load_images(Path(data.root), (channels, height, width), data.labels or None,
                            (data.val_fraction, data.test_fraction), data.split_seed, image_store(cfg),
                            multi_label=cfg.task.image_columns(data.label_column))
    return Dataset(loaded.train.head(data.train_limit), loaded.val, loaded.test.head(data.test_limit), loaded.labels)


def image_store(cfg: PipelineConfig) -> Path:
    """Where a run keeps a user's decoded images (``ImageFile``), shared by its stages."""
    return Path(cfg.run_dir) / "images"
