"""``python -m service``: a command line built from the ``Settings`` fields; flags override ``DIRECTOR_*``.

Secrets (``SecretStr`` fields: the API key, the feedback database's URL) get no flag: a command line is readable by
every user of the machine (``ps``), so they come from the environment or a file (``--api-key-file``); the help lists
them with their variables."""

from __future__ import annotations

import argparse
import os
import types
import typing
from typing import Any, get_args, get_origin

from pydantic import SecretStr

from service.config import Settings

ENV_PREFIX = "DIRECTOR_"


def _kind(annotation: Any) -> Any:
    """The plain type behind ``X | None``, ``Annotated[...]`` and ``Literal[...]``."""
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _kind(get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return _kind(next(a for a in get_args(annotation) if a is not type(None)))
    return annotation


def _secret(annotation: Any) -> bool:
    """A key, or named keys: from the environment or a file only, never a flag (flags show on the process list)."""
    kind = _kind(annotation)
    return kind is SecretStr or (get_origin(kind) is dict and SecretStr in get_args(kind))


def _secrets_epilog() -> str:
    secrets = [f"{ENV_PREFIX}{name.upper()}: {field.description or ''}"
               for name, field in Settings.model_fields.items() if _secret(field.annotation)]
    return "secrets, from the environment only: " + "; ".join(secrets).replace("%", "%%")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service", description="Serve DIRECTOR artifacts from a model repository. Every option is "
        f"also read from the environment as {ENV_PREFIX}<NAME>; a flag given here overrides it.",
        epilog=_secrets_epilog(), argument_default=argparse.SUPPRESS,
        allow_abbrev=False)  # no prefix of --api-key-file is a flag
    for name, field in Settings.model_fields.items():
        kind = _kind(field.annotation)
        if _secret(field.annotation):
            continue  # environment or file only: listed in the epilog
        flag = "--" + name.replace("_", "-")
        env = ENV_PREFIX + name.upper()
        default = "" if field.is_required() else f" (default: {field.get_default(call_default_factory=True)})"
        help_text = f"{field.description or ''}{default} [env {env}]".replace("%", "%%")
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        elif get_origin(kind) is typing.Literal:
            parser.add_argument(flag, choices=list(get_args(kind)), help=help_text)
        elif get_origin(kind) is list:
            parser.add_argument(flag, metavar="A,B", help=help_text)
        else:
            parser.add_argument(flag, metavar=name.upper(), help=help_text)
    return parser


def settings_from_args(argv: list[str] | None = None) -> Settings:
    """Parse flags, export them as ``DIRECTOR_*`` (so uvicorn worker processes see them too), build Settings."""
    args = vars(build_parser().parse_args(argv))
    for name, value in args.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        os.environ[ENV_PREFIX + name.upper()] = str(value)
    return Settings()
