"""Weights stored in fewer bytes and computed in float32, so a text artifact's file is smaller.

``HalfStoredLinear``: the large text layers (the deterministic prefix and the readout's feed-forward sublayer) take
half the bytes, with one float32 copy made on first use. The copy lives in a buffer that ``forward`` fills
(TorchScript allows it), so a loaded artifact pays the conversion once per device instead of per forward, and the file
holds only the float16 weights.

``WordTable``: the token table (the bulk of a text artifact) as float32, float16 or int8 with a per-row scale,
dequantised on lookup; every text family's embedding (encoder and decoder) stores its table this way.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

TABLE_DTYPES: tuple[str, ...] = ("float32", "float16", "int8")


def quantize_rows(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: table [V, D] -> (int8 codes [V, D], float32 scales [V]); row v is ``codes[v] *
    scales[v]`` within ``scales[v] / 2`` per element (the scale is the row's max |value| / 127)."""
    table = table.float()
    scales = table.abs().amax(dim=1).clamp_min(1e-12) / 127.0  # [V]
    codes = torch.round(table / scales[:, None]).clamp(-127, 127).to(torch.int8)  # [V, D]
    return codes, scales


class WordTable(nn.Module):
    """The base of a text embedding: the word table [V, D] as buffers ``word_table`` and ``word_scale`` (int8 only,
    else empty) on the embedding itself, so the state-dict keys stay those of every saved artifact and run.

    ``table_dtype`` is float32 (exact), float16, or int8 with one float32 scale per row; ``words`` dequantises the
    looked-up rows to float32.
    """

    def __init__(self, word: torch.Tensor, table_dtype: str = "float32") -> None:
        super().__init__()
        if table_dtype not in TABLE_DTYPES:
            raise ValueError(f"unknown table dtype {table_dtype!r}; expected one of {TABLE_DTYPES}")
        self.table_dtype = table_dtype
        self.quantized = table_dtype == "int8"
        word = word.detach().float()
        if self.quantized:
            table, scale = quantize_rows(word)
        else:
            table, scale = word.to(getattr(torch, table_dtype)).clone(), torch.zeros(0)
        self.register_buffer("word_table", table)  # [V, D]
        self.register_buffer("word_scale", scale)  # [V] int8 only

    @property
    def vocab_size(self) -> int:
        return int(self.word_table.shape[0])

    def float_table(self) -> torch.Tensor:
        """The table [V, D] in float32, to re-store in another dtype; an int8 table's rounding cannot be undone."""
        if self.quantized:
            raise ValueError("cannot re-store an int8 table")
        return self.word_table.float()  # [V, D]

    def words(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [B, L] -> the word vectors [B, L, D] in float32."""
        rows = self.word_table[input_ids].float()  # [B, L, D]
        if self.quantized:
            rows = rows * self.word_scale[input_ids].unsqueeze(-1)  # [B, L, D]
        return rows


class HalfStoredLinear(nn.Module):
    """``nn.Linear`` with its weight stored as float16 (bias float32); [.., in] -> [.., out] in float32."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.register_buffer("weight_half", linear.weight.detach().half().clone())  # [out, in]
        bias = linear.bias.detach().float().clone() if linear.bias is not None else torch.zeros(linear.out_features)
        self.register_buffer("bias", bias)  # [out]
        self.register_buffer("weight_cache", torch.zeros(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_cache.numel() == 0 or self.weight_cache.device != x.device:
            self.weight_cache = self.weight_half.to(x.device).float()  # [out, in] once per device
        return F.linear(x, self.weight_cache, self.bias)


def drop_weight_caches(module: nn.Module) -> nn.Module:
    """Empty every ``HalfStoredLinear``'s float32 weight cache in ``module`` (a forward before export fills them, and
    TorchScript saves a buffer whether or not it is persistent: a saved cache would double the layers' size)."""
    for child in module.modules():
        if isinstance(child, HalfStoredLinear):
            child.weight_cache = torch.zeros(0)
    return module


def store_linears_in_half(module: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` inside ``module`` (in place) by a ``HalfStoredLinear``; returns ``module``."""
    for name, child in list(module.named_modules()):
        if isinstance(child, nn.Linear):
            parent_name, _, attr = name.rpartition(".")
            setattr(module.get_submodule(parent_name) if parent_name else module, attr, HalfStoredLinear(child))
    return module
