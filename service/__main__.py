"""``python -m service [--help]``: serve the model repository."""

from __future__ import annotations

from service.cli import settings_from_args
from service.launch import serve


def main(argv: list[str] | None = None) -> int:
    return serve(settings_from_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
