"""A module as an artifact holds it: scripted, saved and loaded back (what the model tests check scripting with)."""

from __future__ import annotations

import io

import torch


def scripted(module: torch.nn.Module) -> torch.jit.ScriptModule:
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)
