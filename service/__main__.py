"""``python -m service [--help]``: serve the model repository."""

from __future__ import annotations

from service.cli import settings_from_args
from service.server import serve


def main(argv: list[str] | None = None) -> int:
    serve(settings_from_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
