"""Score a dataset offline with the server's own artifacts, batching, summaries and OOD rule, without running a
server: ``python -m service.batch_scoring --model fashion-vit --input PATH --output scores.jsonl``.

PATH is an image folder (PNG / JPEG, searched recursively; each converted as ``/predict`` converts an upload), a JSONL
file (one ``/predict`` input per line: ``{"text": ...}``, ``{"image_base64": ...}`` or ``{"pixels": ...}``, with an
optional ``"id"``) or a CSV file (``--text-column``, optional ``--id-column``). Each output line is one input's
prediction as ``/predict`` returns it, with its ``key`` (file path, id or line number), the model version and the OOD
rule. An input the server would refuse (a corrupt image, an empty text, a line that is not UTF-8 or not JSON, or
nested too deep) gets a line with its ``error`` and ``status`` instead, and the run goes on. ``--coverage`` and
``--max-risk`` (with ``--conformal-score``, ``--class-conditional``, ``--no-abstain-if-ood``) add each input's
``prediction_set`` / ``set_size`` / ``abstain`` and the rules applied (``decisions``), as ``/predict`` does
(docs/api.md, "Prediction sets and abstentions").

Only the version scored is loaded (the one named, else the model's highest). Before it is, a bad flag or output path
is refused in one line with the usage (exit 2), and so are a model or version the repository lacks and two inputs
under one key (an id equal to another's, or to the line number of a line without one: a resumed run would take the
second for done), each in one line (exit 2).

The lines are appended to ``OUTPUT.partial`` (beside the output) and the file is renamed to OUTPUT when the run is
over, so a crash never leaves a half-written OUTPUT and never touches a finished one. The run resumes: inputs whose
key is already in the partial file (or, when there is none, in OUTPUT) are skipped, a line cut short by a crash
dropped first. The output may not be the input, nor a link to it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from tqdm import tqdm

from artifact.contract import is_published
from service.api.oip_decisions import SCORES, decision_request
from service.api.protocol import SEED_MAX, ImageRequestInput, RequestInput, raw_inputs
from service.api.routes.predict import to_response
from service.config import Settings
from service.engine.decisions import DecisionRequest
from service.engine.repository import Only
from service.errors import ApiError, shown
from service.state import AppState

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}
DEFAULT_MODEL = "fashion-vit"
INPUT = TypeAdapter(RequestInput)
Item = tuple[str, RequestInput | ApiError]  # (key, the input, or why it cannot be one)


def read_inputs(path: Path, text_column: str, id_column: str | None) -> Iterator[Item]:
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()):
            encoded = base64.b64encode(file.read_bytes()).decode()
            yield str(file.relative_to(path)), ImageRequestInput(image_base64=encoded)
    elif path.suffix.lower() == ".csv":
        # bytes that are not UTF-8 stay as lone surrogates, so the row that holds them is refused, not the file
        with path.open(newline="", encoding="utf-8", errors="surrogateescape") as handle:
            for line, row in enumerate(csv.DictReader(handle), start=1):
                key = row.get(id_column) if id_column else None
                text = row.get(text_column) or ""
                if not all(is_utf8(value) for value in (text, key or "")):
                    yield str(line), ApiError(400, f"row {line} is not UTF-8 text")
                    continue
                yield (key or str(line)), INPUT.validate_python({"text": text})
    else:
        with path.open("rb") as handle:
            for line, raw in enumerate(handle, start=1):
                if raw.strip():
                    yield _json_item(line, raw)


def is_utf8(text: str) -> bool:
    """Whether a string read with ``surrogateescape`` held valid UTF-8 only."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_item(line: int, raw: bytes) -> Item:
    try:
        value = json.loads(raw.decode("utf-8"))
        key = str(value.pop("id", line)) if isinstance(value, dict) else str(line)
        return key, INPUT.validate_python(value)
    except UnicodeDecodeError:
        return str(line), ApiError(400, f"line {line} is not UTF-8 text")
    except RecursionError:
        return str(line), ApiError(422, f"line {line} is nested too deeply to be a /predict input")
    except (ValueError, ValidationError) as exc:
        return str(line), ApiError(422, f"line {line} is not a /predict input: {str(exc).splitlines()[0][:300]}")


def partial_path(output: Path) -> Path:
    """Where a run appends its lines before the output is renamed into place."""
    return output.with_name(output.name + ".partial")


def done_keys(partial: Path, output: Path) -> set[str]:
    """Keys already scored. The partial file of an unfinished run is kept (a last line cut short by a crash dropped);
    without one, a finished output is copied to start it, so the output itself is only ever replaced whole."""
    if not partial.is_file():
        if not output.is_file():
            return set()
        shutil.copyfile(output, partial)
    kept, keys = [], set()
    for raw in partial.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            keys.add(json.loads(raw)["key"])
            kept.append(raw)
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
    partial.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    return keys


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (through links too); False when either does not exist."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


async def score(state: AppState, items: list[tuple[str, RequestInput]], model: str | None, version: str | None,
                n_samples: int | None, seed: int | None, ask: DecisionRequest | None = None) -> list[dict[str, Any]]:
    """One request's worth of inputs, as ``/predict`` answers them (probabilities included, and the sets and
    abstentions ``ask`` wants, with the rules applied on every line)."""
    started = time.perf_counter()
    predictor = state.predictor
    entry = predictor.resolve(model, version)
    count = predictor.samples(entry, n_samples)
    outcome = await predictor.predict(entry, raw_inputs([item for _, item in items]), count, seed, ask=ask)
    body = to_response(outcome, True, started).body
    answer = json.loads(body)
    common = {"model": answer["model"], "model_version": answer["model_version"], "n_samples": answer["n_samples"],
              "ood_score_name": answer["ood"]["score"], "ood_threshold": answer["ood"]["threshold"],
              **({"decisions": answer["decisions"]} if "decisions" in answer else {})}
    return [{"key": key, **common, **{k: v for k, v in p.items() if k != "index"}}
            for (key, _), p in zip(items, answer["predictions"], strict=True)]


async def score_chunk(state: AppState, chunk: list[Item], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The chunk in one request; when the server would refuse it, input by input, so that one bad input costs only
    its own line."""
    lines = [{"key": key, "error": str(item), "status": item.status} for key, item in chunk
             if isinstance(item, ApiError)]
    good = [(key, item) for key, item in chunk if not isinstance(item, ApiError)]
    if not good:
        return lines
    try:
        return await score(state, good, args.model, args.version, args.n_samples, args.seed, asked(args)) + lines
    except ApiError as exc:
        if len(good) == 1:
            return [{"key": good[0][0], "error": str(exc), "status": exc.status}, *lines]
    for single in good:
        lines += await score_chunk(state, [single], args)
    return lines


async def run(args: argparse.Namespace, items: list[Item]) -> int:
    from service.app import create_app  # after the settings are final

    only = Only(args.model or DEFAULT_MODEL, args.version)
    partial = partial_path(args.output)
    with tempfile.TemporaryDirectory(prefix="director-scoring-") as tmp:
        settings = Settings(model_repository=args.model_repository, default_model=only.model, poll_interval_s=0,
                            torch_threads=args.threads,
                            feedback_db=Path(tmp) / "feedback.sqlite3")  # nothing logged to a server's store
        app = create_app(settings, only=only)
        async with app.router.lifespan_context(app):
            state: AppState = app.state.director
            await wait_scanned(state)
            try:  # a broken version, a sample count or decision ask it cannot take fails the run, not every input
                entry = state.predictor.resolve(only.model, only.version)
                state.predictor.samples(entry, args.n_samples)
                state.predictor.decisions_for(entry, asked(args))
            except ApiError as exc:
                print(f"cannot score: {exc}", file=sys.stderr)
                return 2
            skip = done_keys(partial, args.output)
            written = await write_lines(state, [item for item in items if item[0] not in skip], partial, args)
    partial.replace(args.output)
    print(f"{written} inputs scored into {args.output} ({len(skip)} already there)", file=sys.stderr)
    return 0


async def write_lines(state: AppState, items: list[Item], partial: Path, args: argparse.Namespace) -> int:
    """Score ``items`` chunk by chunk, each chunk's lines appended to the partial file; how many were written."""
    written = 0
    with partial.open("a", encoding="utf-8") as out, tqdm(total=len(items), unit="input", desc="scoring",
                                                          file=sys.stderr) as bar:
        for start in range(0, len(items), args.chunk):
            chunk = items[start:start + args.chunk]
            lines = await score_chunk(state, chunk, args)
            out.writelines(json.dumps(line) + "\n" for line in lines)
            out.flush()
            written += len(lines)
            bar.update(len(chunk))
    return written


async def wait_scanned(state: AppState, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not state.repository.scanned_once:
        if time.monotonic() > deadline:
            raise TimeoutError("the model repository was not scanned in time")
        await asyncio.sleep(0.05)


def asked(args: argparse.Namespace) -> DecisionRequest:
    """The run's sets and abstentions, checked as an OIP request's parameters are (``/predict``'s ranges)."""
    return decision_request({"coverage": args.coverage, "conformal_score": args.conformal_score,
                             "class_conditional": args.class_conditional, "max_risk": args.max_risk,
                             "abstain_if_ood": args.abstain_if_ood}, ["flags"])


def decision_flags(parser: argparse.ArgumentParser) -> None:
    """``/predict``'s coverage and max_risk asks as flags (docs/api.md, "Prediction sets and abstentions")."""
    parser.add_argument("--coverage", type=float, help="add each input's prediction_set at this coverage (0-1)")
    parser.add_argument("--conformal-score", choices=SCORES, help="the sets' score (default: the version's)")
    parser.add_argument("--class-conditional", action="store_true", help="sets with the coverage within each class")
    parser.add_argument("--max-risk", type=float, help="add each input's abstain flag at this risk (0-1)")
    parser.add_argument("--abstain-if-ood", action=argparse.BooleanOptionalAction, default=True,
                        help="with --max-risk: OOD-flagged inputs abstain (default: yes)")


def argument_problem(args: argparse.Namespace) -> str | None:
    """Why the flags cannot make a run, in one line, before any model is loaded (None when they can)."""
    if not args.input.exists():
        return f"no such input: {args.input}"
    try:
        asked(args)
    except ApiError as exc:
        return str(exc)
    problem = output_problem(args.output)
    if problem is None and (any(same_file(path, args.input) for path in (args.output, partial_path(args.output)))
                            or args.output.resolve() == args.input.resolve()):
        problem = f"the output {args.output} is the input: scoring would overwrite it"
    return problem or columns_problem(args)


def output_problem(output: Path) -> str | None:
    """Why the run could not write its partial file or rename it to the output (None when it can): tried with a
    file of its own, since permissions do not say it for root or a read-only mount."""
    folder = output.parent
    if not folder.exists():
        return f"the output's folder {folder} does not exist"
    if not folder.is_dir():
        return f"the output's folder {folder} is not a folder"
    if output.is_dir():
        return f"the output {output} is a folder"
    if partial_path(output).is_dir():
        return f"the output's partial file {partial_path(output)} is a folder"
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".director-scoring-"):
            pass
    except OSError as exc:
        return f"cannot write in the output's folder {folder}: {exc.strerror or exc}"
    return None


def columns_problem(args: argparse.Namespace) -> str | None:
    """The columns the flags name must be in the CSV's header; an input that is no CSV file has none."""
    named = [name for name in (args.text_column, args.id_column) if name is not None]
    if args.input.is_dir() or args.input.suffix.lower() != ".csv":
        flag = "--text-column" if args.text_column is not None else "--id-column"
        return f"{flag} is for a CSV input, and {args.input} is not one" if named else None
    with args.input.open(newline="", encoding="utf-8", errors="surrogateescape") as handle:
        header = next(csv.reader(handle), [])
    missing = [name for name in (args.text_column or "text", args.id_column) if name is not None and name not in header]
    if missing:
        return f"the CSV has no column {shown(missing[0])} (its columns: {shown(', '.join(header))})"
    return None


def duplicate_key(items: list[Item]) -> str | None:
    """Keys name one input each: a resumed run skips the keys already written, so a second input under one key would
    never be scored (an id may be neither another input's id nor the line number that keys a line without one)."""
    seen: set[str] = set()
    for key, _ in items:
        if key in seen:
            return (f"key {shown(key)} names two inputs (an id, or the line number of an input without one): give "
                    "each input an id of its own")
        seen.add(key)
    return None


def model_problem(repository: Path, only: Only) -> str | None:
    """Why the repository has no folder for the version to score (None when it has one)."""
    folder = repository / only.model
    if not is_published(folder):
        return f"no model {shown(only.model)} in {repository} (its models: {published(repository)})"
    if only.version is not None and not is_published(folder / only.version):
        return f"model {shown(only.model)} has no version {shown(only.version)} (its versions: {published(folder)})"
    return None


def published(folder: Path) -> str:
    names = [d.name for d in filter(is_published, sorted(folder.iterdir()))] if folder.is_dir() else []
    return ", ".join(names) or "none"


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` (to ``high``)."""
    bounds = f"at least {low}" if high is None else f"between {low} and {high}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text[:40]!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    return parse


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, required=True, help="image folder, .jsonl or .csv")
    parser.add_argument("--output", type=Path, required=True, help="JSONL of predictions (appended; resumes)")
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--model", help=f"model name (default: {DEFAULT_MODEL})")
    parser.add_argument("--version", help="model version (default: the highest; only it is loaded)")
    parser.add_argument("--n-samples", type=whole(1), help="samples per input (default: the manifest's)")
    parser.add_argument("--seed", type=whole(0, SEED_MAX), help="reproducible samples (each chunk runs under it)")
    parser.add_argument("--chunk", type=whole(1), default=64, help="inputs per forward request")
    parser.add_argument("--threads", type=whole(0), default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--text-column", help="CSV column holding the texts (default: text)")
    parser.add_argument("--id-column", help="CSV column holding each row's key (default: its line number)")
    decision_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    items: list[Item] = []
    try:
        problem = argument_problem(args)
        if problem is None:
            items = list(read_inputs(args.input, args.text_column or "text", args.id_column))
    except OSError as exc:
        problem = f"cannot read the input {args.input}: {exc.strerror or exc}"
    if problem is not None:
        parser.error(problem)
    problem = duplicate_key(items) or model_problem(args.model_repository, Only(args.model or DEFAULT_MODEL,
                                                                                args.version))
    if problem is not None:
        print(f"cannot score: {problem}", file=sys.stderr)
        return 2
    return asyncio.run(run(args, items))


if __name__ == "__main__":
    sys.exit(main())
