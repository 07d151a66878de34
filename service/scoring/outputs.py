"""Where an offline run writes its lines, so that a run stopped anywhere resumes with nothing lost or written twice.

JSONL (any output not named ``.parquet``): lines are appended to ``OUTPUT.partial`` and flushed chunk by chunk. Parquet:
lines are written to ``OUTPUT.partial/`` as part files, each renamed into place once whole. Either way the partial
output becomes OUTPUT when the run is over (Parquet: the parts merged into one file), so a crash never leaves a
half-written OUTPUT and never touches a finished one. A run resumes from the partial output: the keys already there
are skipped (a JSONL line cut short by a crash is dropped first; a Parquet part is whole or absent). Without a partial
output, a finished OUTPUT is its start, and so OUTPUT is only ever replaced whole."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, TextIO

ROWS_PER_PART = 4096  # Parquet lines per part file: a crash costs at most this many lines scored again


def partial_path(output: Path) -> Path:
    """Where a run writes before the output is renamed into place."""
    return output.with_name(output.name + ".partial")


def is_parquet(output: Path) -> bool:
    return output.suffix.lower() == ".parquet"


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (through links too); False when either does not exist."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def output_problem(output: Path) -> str | None:
    """Why the run could not write its partial output or rename it to the output (None when it can): tried with a
    file of its own, since permissions do not say it for root or a read-only mount."""
    folder, partial = output.parent, partial_path(output)
    if not folder.exists():
        return f"the output's folder {folder} does not exist"
    if not folder.is_dir():
        return f"the output's folder {folder} is not a folder"
    if output.is_dir():
        return f"the output {output} is a folder"
    if partial.is_dir() and not is_parquet(output):
        return f"the output's partial file {partial} is a folder"
    if partial.exists() and not partial.is_dir() and is_parquet(output):
        return f"the output's partial folder {partial} is a file"
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".director-scoring-"):
            pass
    except OSError as exc:
        return f"cannot write in the output's folder {folder}: {exc.strerror or exc}"
    return None


def sink_for(output: Path) -> JsonlSink | ParquetSink:
    return ParquetSink(output) if is_parquet(output) else JsonlSink(output)


class JsonlSink:
    def __init__(self, output: Path) -> None:
        self.output, self.partial = output, partial_path(output)
        self._handle: TextIO | None = None

    def done(self) -> set[str]:
        """Keys already scored; the partial file keeps only its whole lines."""
        if not self.partial.is_file():
            if not self.output.is_file():
                return set()
            shutil.copyfile(self.output, self.partial)
        kept, keys = [], set()
        for raw in self.partial.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                keys.add(json.loads(raw)["key"])
                kept.append(raw)
            except (ValueError, KeyError, TypeError, RecursionError):
                continue
        self.partial.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        return keys

    def write(self, lines: list[dict[str, Any]]) -> None:
        if self._handle is None:
            self._handle = self.partial.open("a", encoding="utf-8")
        self._handle.writelines(json.dumps(line) + "\n" for line in lines)
        self._handle.flush()

    def finish(self) -> None:
        self.close()
        self.partial.touch()  # a run with nothing to score still leaves its output
        self.partial.replace(self.output)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class ParquetSink:
    def __init__(self, output: Path) -> None:
        self.output, self.partial = output, partial_path(output)
        self._rows: list[dict[str, Any]] = []

    def parts(self) -> list[Path]:
        return sorted(self.partial.glob("part-*.parquet"))

    def done(self) -> set[str]:
        """Keys already scored: those of the whole parts (a part being written when a run stopped is removed)."""
        import pyarrow.parquet as pq

        if not self.partial.is_dir():
            self.partial.mkdir()
            if self.output.is_file():
                shutil.copyfile(self.output, self.partial / "part-000000.parquet")
        for leftover in self.partial.glob(".part-*"):
            leftover.unlink()
        return {key for part in self.parts() for key in pq.read_table(part, columns=["key"]).column("key").to_pylist()}

    def write(self, lines: list[dict[str, Any]]) -> None:
        self._rows.extend(lines)
        if len(self._rows) >= ROWS_PER_PART:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._rows:
            return
        names = list(dict.fromkeys(name for row in self._rows for name in row))
        table = pa.Table.from_pylist([{name: row.get(name) for name in names} for row in self._rows])
        number = max((int(part.stem.split("-")[1]) for part in self.parts()), default=-1) + 1
        staged = self.partial / f".part-{number:06d}.parquet"
        pq.write_table(table, staged)
        staged.replace(self.partial / f"part-{number:06d}.parquet")
        self._rows = []

    def finish(self) -> None:
        """The parts merged into OUTPUT, their schemas unified (a column a part lacks is null in its rows)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.flush()
        parts = self.parts()
        schemas = [pq.read_schema(part) for part in parts]
        schema = pa.unify_schemas(schemas, promote_options="permissive") if schemas else \
            pa.schema([("key", pa.string())])
        staged = self.output.with_name(f".{self.output.name}.merging")
        with pq.ParquetWriter(staged, schema) as writer:
            for part in parts:
                table = pq.read_table(part)
                columns = [table.column(f.name).cast(f.type) if f.name in table.column_names
                           else pa.nulls(len(table), f.type) for f in schema]
                writer.write_table(pa.Table.from_arrays(columns, schema=schema))
        staged.replace(self.output)
        shutil.rmtree(self.partial)

    def close(self) -> None:
        """Lines not yet in a part are dropped: they are scored again when the run resumes."""
        self._rows = []
