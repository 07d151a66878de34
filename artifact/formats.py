"""The artifact formats a manifest's ``artifact.format`` names (docs/architecture.md): TorchScript (``director.ts``,
the default) and an AOTInductor package of ``torch.export`` programs (``director.pt2``), shipped beside the
TorchScript file, never instead of it: a server that cannot run the package can be pointed back at director.ts.

A package is compiled code for one device kind, one CPU instruction set and one torch; ``artifact.compiled`` records
them so a server can refuse a package it cannot run with a reason instead of crashing in it."""

from __future__ import annotations

from pydantic import ValidationError

from artifact.contract import ArtifactInfo, ManifestError, Section

TORCHSCRIPT_FORMAT = "torchscript"
AOTI_FORMAT = "aoti"
FORMATS = (TORCHSCRIPT_FORMAT, AOTI_FORMAT)
EXPORTED_ARTIFACT = "director.pt2"


class Compiled(Section):
    """``artifact.compiled``: what an AOTInductor package was compiled for."""

    device: str  # "cpu" or "cuda"
    methods: list[str]  # the contract's methods in the package, one compiled model each
    # per input (the model's, then repeats), per dimension: its size, or [min, max] (max null: unbounded)
    inputs: list[list[int | tuple[int, int | None]]] | None = None
    cpu_isa: str | None = None  # the compiled code's CPU instruction set (e.g. "AVX512 AVX512_VNNI"), CPU packages
    compute_capability: str | None = None  # CUDA packages
    machine: str | None = None  # e.g. "x86_64"
    torch: str | None = None  # the torch that compiled it


def artifact_format(info: ArtifactInfo | None) -> str:
    """The manifest's format; a manifest without an ``artifact`` section predates the field: TorchScript."""
    return info.format if info is not None else TORCHSCRIPT_FORMAT


def compiled_of(info: ArtifactInfo | None) -> Compiled:
    """The typed ``artifact.compiled`` of a package's manifest; ``ManifestError`` when it is missing or malformed."""
    raw = (info.model_extra or {}).get("compiled") if info is not None else None
    if raw is None:
        raise ManifestError(f"artifact.format {AOTI_FORMAT!r} needs artifact.compiled (device, methods)")
    try:
        return Compiled.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ManifestError(f"manifest artifact.compiled.{where}: {first['msg']}") from None
