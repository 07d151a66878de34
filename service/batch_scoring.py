"""Score a dataset offline with the server's own artifacts, forwards, summaries and OOD rule, without running a
server: ``python -m service.batch_scoring --model fashion-vit --input PATH --output scores.jsonl``.

PATH is an image folder (PNG / JPEG, searched recursively; each converted as ``/predict`` converts an upload), a JSONL
file (one ``/predict`` input per line: ``{"text": ...}``, ``{"image_base64": ...}`` or ``{"pixels": ...}``, with an
optional ``"id"``) or a CSV or Parquet file (``--text-column``, optional ``--id-column``). Each output line is one
input's prediction as ``/predict`` returns it, with its ``key`` (file path, id or line number), the model version and
the OOD rule. An input the server would refuse (a corrupt image, an empty text, a line that is not UTF-8 or not JSON,
or nested too deep) gets a line with its ``error`` and ``status`` instead, and the run goes on. ``--coverage`` and
``--max-risk`` (with ``--conformal-score``, ``--class-conditional``, ``--no-abstain-if-ood``, ``--no-widen-if-shifted``)
add each input's ``prediction_set`` / ``set_size`` / ``abstain`` and the rules applied (``decisions``), as
``/predict`` does (docs/api.md, "Prediction sets and abstentions"). Each ``--chunk`` of inputs is answered as one
``/predict`` request (under ``--seed``, when given).

``--engine ray`` scores on Ray Data instead (``service.scoring.ray_data``): a local Ray, or the cluster at
``--address``, with ``--actors`` scorers of ``--num-cpus`` / ``--num-gpus`` each; the same lines, keys and resume.

Only the version scored is loaded (the one named, else the model's highest). Before it is, a bad flag or output path
is refused in one line with the usage (exit 2), and so are a model or version the repository lacks and two inputs
under one key (an id equal to another's, or to the line number of a line without one: a resumed run would take the
second for done), each in one line (exit 2).

The output is JSONL, or Parquet when it is named ``.parquet``. It is written to ``OUTPUT.partial`` (beside the output)
and renamed to OUTPUT when the run is over, so a crash never leaves a half-written OUTPUT and never touches a finished
one. The run resumes: inputs whose key is already in the partial output (or, when there is none, in OUTPUT) are
skipped (``service.scoring.outputs``). The output may not be the input, nor a link to it.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from artifact.contract import is_published
from service.api.oip_decisions import SCORES, decision_request
from service.api.protocol import SEED_MAX
from service.config import Settings
from service.engine.decisions import DecisionRequest
from service.engine.repository import Only
from service.errors import ApiError, shown
from service.scoring.batches import Item
from service.scoring.inputs import Source, columns_of, read_inputs
from service.scoring.outputs import JsonlSink, ParquetSink, output_problem, partial_path, same_file, sink_for
from service.scoring.ray_data import RayJob, run_on_ray
from service.scoring.scorer import Scorer
from service.scoring.segments import duplicate_message
from service.scoring.version import ScoringError

DEFAULT_MODEL = "fashion-vit"


def source_of(args: argparse.Namespace) -> Source:
    return Source(args.input, args.text_column or "text", args.id_column)


def scorer_arguments(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    return {"repository": args.model_repository, "model": args.model or DEFAULT_MODEL, "version": args.version,
            "n_samples": args.n_samples, "seed": args.seed, "ask": asked(args),
            "settings": Settings(model_repository=args.model_repository, torch_threads=threads)}


def ray_job(args: argparse.Namespace) -> RayJob:
    """The Ray run the flags ask for: each actor with as many torch threads as it has CPUs, unless --threads."""
    threads = args.threads or max(1, math.ceil(args.num_cpus))
    return RayJob(source_of(args), args.output, args.chunk, scorer_arguments(args, threads), args.address,
                  args.actors, args.num_cpus, args.num_gpus)


def score_chunk(scorer: Scorer, chunk: list[Item]) -> list[dict[str, Any]]:
    """The chunk's lines, answered as one request (input by input where the server would refuse it)."""
    return scorer.lines(chunk)


def run(args: argparse.Namespace, items: list[Item]) -> int:
    try:  # a broken version, a sample count or decision ask it cannot take fails the run, not every input
        scorer = Scorer(**scorer_arguments(args, args.threads))
    except ScoringError as exc:
        print(f"cannot score: {exc}", file=sys.stderr)
        return 2
    sink = sink_for(args.output)
    skip = sink.done()
    try:
        written = write_lines(scorer, [item for item in items if item[0] not in skip], sink, args.chunk)
        sink.finish()
    finally:
        sink.close()  # after a failure: what was written stays for the next run to resume from
    print(f"{written} inputs scored into {args.output} ({len(skip)} already there)", file=sys.stderr)
    return 0


def write_lines(scorer: Scorer, items: list[Item], sink: JsonlSink | ParquetSink, chunk: int) -> int:
    """Score ``items`` chunk by chunk, each chunk's lines written to the partial output; how many were written."""
    written = 0
    with tqdm(total=len(items), unit="input", desc="scoring", file=sys.stderr) as bar:
        for start in range(0, len(items), chunk):
            part = items[start:start + chunk]
            lines = score_chunk(scorer, part)
            sink.write(lines)
            written += len(lines)
            bar.update(len(part))
    return written


def asked(args: argparse.Namespace) -> DecisionRequest:
    """The run's sets and abstentions, checked as an OIP request's parameters are (``/predict``'s ranges)."""
    return decision_request({"coverage": args.coverage, "conformal_score": args.conformal_score,
                             "class_conditional": args.class_conditional, "max_risk": args.max_risk,
                             "abstain_if_ood": args.abstain_if_ood, "widen_if_shifted": args.widen_if_shifted},
                            ["flags"])


def decision_flags(parser: argparse.ArgumentParser) -> None:
    """``/predict``'s coverage and max_risk asks as flags (docs/api.md, "Prediction sets and abstentions")."""
    parser.add_argument("--coverage", type=float, help="add each input's prediction_set at this coverage (0-1)")
    parser.add_argument("--conformal-score", choices=SCORES, help="the sets' score (default: the version's)")
    parser.add_argument("--class-conditional", action="store_true", help="sets with the coverage within each class")
    parser.add_argument("--max-risk", type=float, help="add each input's abstain flag at this risk (0-1)")
    parser.add_argument("--abstain-if-ood", action=argparse.BooleanOptionalAction, default=True,
                        help="with --max-risk: inputs that are not exchangeable (OOD-flagged, or in a chunk that looks "
                             "shifted) abstain (default: yes)")
    parser.add_argument("--widen-if-shifted", action=argparse.BooleanOptionalAction, default=True,
                        help="with --coverage: a chunk that looks shifted gets sets of every label (default: yes)")


def ray_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=("local", "ray"), default="local",
                        help="local: this process; ray: Ray Data's actors (default: local)")
    parser.add_argument("--address", help="with --engine ray: the Ray cluster (default: a local Ray of this machine)")
    parser.add_argument("--actors", type=whole(1), help="with --engine ray: scorers (default: as many as fit)")
    parser.add_argument("--num-cpus", type=float, default=1.0, help="with --engine ray: CPUs per scorer (default 1)")
    parser.add_argument("--num-gpus", type=float, default=0.0, help="with --engine ray: GPUs per scorer (default 0)")


def argument_problem(args: argparse.Namespace) -> str | None:
    """Why the flags cannot make a run, in one line, before any model is loaded (None when they can)."""
    if not args.input.exists():
        return f"no such input: {args.input}"
    try:
        asked(args)
    except ApiError as exc:
        return str(exc)
    if args.engine == "local" and any(flag is not None for flag in (args.address, args.actors)):
        return "--address and --actors are for --engine ray"
    if args.num_cpus <= 0 or args.num_gpus < 0:
        return "--num-cpus must be above 0 and --num-gpus at least 0"
    problem = extra_problem(args) or output_problem(args.output)
    if problem is None and (any(same_file(path, args.input) for path in (args.output, partial_path(args.output)))
                            or args.output.resolve() == args.input.resolve()):
        problem = f"the output {args.output} is the input: scoring would overwrite it"
    return problem or columns_problem(args)


def extra_problem(args: argparse.Namespace) -> str | None:
    """Ray and Parquet come with the ``offline`` extra, which the serving image leaves out."""
    needs = {"ray": args.engine == "ray",
             "pyarrow": any(path.suffix.lower() == ".parquet" for path in (args.input, args.output))}
    missing = [name for name, needed in needs.items() if needed and importlib.util.find_spec(name) is None]
    if missing:
        return f"{missing[0]} is not installed here: pip install 'director-serving[offline]'"
    return None


def columns_problem(args: argparse.Namespace) -> str | None:
    """The columns the flags name must be in a CSV's header or a Parquet file's schema; other inputs have none."""
    named = [name for name in (args.text_column, args.id_column) if name is not None]
    source = source_of(args)
    header = columns_of(source)
    if header is None:
        flag = "--text-column" if args.text_column is not None else "--id-column"
        return f"{flag} is for a CSV or Parquet input, and {args.input} is neither" if named else None
    missing = [name for name in (source.text_column, source.id_column) if name is not None and name not in header]
    if missing:
        return (f"the {source.kind.upper() if source.kind == 'csv' else 'Parquet file'} has no column "
                f"{shown(missing[0])} (its columns: {shown(', '.join(header))})")
    return None


def duplicate_key(items: list[Item]) -> str | None:
    """Keys name one input each: a resumed run skips the keys already written, so a second input under one key would
    never be scored (an id may be neither another input's id nor the line number that keys a line without one)."""
    seen: set[str] = set()
    for key, _ in items:
        if key in seen:
            return duplicate_message(key)
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
    parser.add_argument("--input", type=Path, required=True, help="image folder, .jsonl, .csv or .parquet")
    parser.add_argument("--output", type=Path, required=True, help="JSONL, or .parquet, of predictions (resumes)")
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--model", help=f"model name (default: {DEFAULT_MODEL})")
    parser.add_argument("--version", help="model version (default: the highest; only it is loaded)")
    parser.add_argument("--n-samples", type=whole(1), help="samples per input (default: the manifest's)")
    parser.add_argument("--seed", type=whole(0, SEED_MAX), help="reproducible samples (each chunk runs under it)")
    parser.add_argument("--chunk", type=whole(1), default=64, help="inputs per forward request")
    parser.add_argument("--threads", type=whole(0), default=0,
                        help="torch threads per scorer (0: torch's default; with --engine ray, --num-cpus)")
    parser.add_argument("--text-column", help="CSV or Parquet column holding the texts (default: text)")
    parser.add_argument("--id-column", help="CSV or Parquet column holding each row's key (default: its row number)")
    decision_flags(parser)
    ray_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    try:
        problem = argument_problem(args)
    except OSError as exc:
        problem = f"cannot read the input {args.input}: {exc.strerror or exc}"
    if problem is not None:
        parser.error(problem)
    problem = model_problem(args.model_repository, Only(args.model or DEFAULT_MODEL, args.version))
    if problem is None and args.engine == "ray":
        return run_on_ray(ray_job(args))
    items: list[Item] = []
    try:
        items = list(read_inputs(source_of(args))) if problem is None else []
    except OSError as exc:
        parser.error(f"cannot read the input {args.input}: {exc.strerror or exc}")
    problem = problem or duplicate_key(items)
    if problem is not None:
        print(f"cannot score: {problem}", file=sys.stderr)
        return 2
    return run(args, items)


if __name__ == "__main__":
    sys.exit(main())
