"""What the server agrees to load. The model repository is code (``torch.jit.load`` runs what it loads), so it is
trusted by design and mounted read-only; two checks narrow what it can bring in:

- a model or version folder that resolves outside the repository (a symlink at either level) is refused: whoever
  may write a link into the repository must not be able to make the server load a folder from anywhere;
- with ``DIRECTOR_TRUSTED_DIGESTS`` (a file kept outside the repository, one sha256 per line as ``sha256sum``
  writes them), a TorchScript file (or AOTInductor package, ``artifact.formats``) whose digest is not listed is
  refused before it is loaded. The manifest's own sha256 list sits beside the files it covers, so it catches
  corruption, not tampering; this list does not.

A refusal is an ``Untrusted`` error: the version is reported unavailable with the reason, which names no absolute
path (the repository's layout is not the caller's business)."""

from __future__ import annotations

import re
from pathlib import Path

from artifact.contract import ARTIFACT, sha256_file
from artifact.formats import EXPORTED_ARTIFACT

DIGEST = re.compile(r"[0-9a-f]{64}")


class Untrusted(Exception):
    """The folder or its artifact may not be loaded."""


def read_digests(path: Path) -> frozenset[str]:
    """The sha256 digests of an allowlist file: the first word of each line; blank lines and ``#`` comments skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise Untrusted(f"cannot read the trusted digests file ({getattr(exc, 'strerror', None) or exc})") from exc
    digests = set()
    for number, line in enumerate(lines, 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if not DIGEST.fullmatch(words[0].lower()):
            raise Untrusted(f"the trusted digests file, line {number}: not a sha256 digest: {words[0][:80]!r}")
        digests.add(words[0].lower())
    return frozenset(digests)


def check(root: Path, folder: Path, trusted_digests: Path | None) -> None:
    """Raise ``Untrusted`` unless ``folder`` (``root/<model>/<version>``) may be loaded. Reads the allowlist on every
    call, so an edit takes effect at the next repository scan without a restart."""
    real_root, real_folder = root.resolve(), folder.resolve()
    if not real_folder.is_relative_to(real_root):
        raise Untrusted(f"{folder.relative_to(root)} resolves outside the model repository (symlinks may not leave "
                        "it)")
    if trusted_digests is None:
        return
    digests = read_digests(trusted_digests)
    # the TorchScript file always; the compiled package (code as well) wherever a version ships one
    names = [ARTIFACT, *([EXPORTED_ARTIFACT] if (real_folder / EXPORTED_ARTIFACT).exists() else [])]
    for name in names:
        try:
            digest = sha256_file(real_folder / name)
        except OSError as exc:
            raise Untrusted(f"cannot read {name}: {exc.strerror or exc}") from exc
        if digest not in digests:
            raise Untrusted(f"{name} sha256 {digest} is not in the trusted digests file")
