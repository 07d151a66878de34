"""DIRECTOR serving: a FastAPI server for model-repository artifacts (docs/architecture.md and docs/api.md).

Imports torch, ``tokenizers`` (text models), ``models.uncertainty`` and ``artifact`` (the contract) only: never
timm, transformers or ``training``."""

__version__ = "0.1.0"
