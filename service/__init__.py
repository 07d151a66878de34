"""DIRECTOR serving: a FastAPI server for model-repository artifacts (DESIGN.md sections 4 and 5).

Imports torch, ``tokenizers`` (text models), ``models.uncertainty`` and ``artifact`` (the contract) only: never
timm, transformers or ``training``."""

__version__ = "0.1.0"
