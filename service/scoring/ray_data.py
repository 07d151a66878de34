"""Offline scoring on Ray Data: ``python -m service.batch_scoring --engine ray ...``.

The driver loads the version once to check it, reads every key once (``service.scoring.segments``: two inputs under
one key are refused, the keys already in the partial output skipped) and cuts the source into segments of whole
chunks. Ray Data reads the segments in parallel (``ChunkSource``, one read task each, one block per chunk) and scores
each block with ``map_batches`` on an actor pool of ``Scorer``s (``service.scoring.scorer``): each actor loads the one
version from the repository path, which every Ray node must see (a shared volume, or a path synced to each node). A
block is the chunk the in-process scorer would answer as one request, so the lines are the in-process scorer's, seed
included. The driver writes the lines as they arrive, in input order, to the same partial output
(``service.scoring.outputs``): a run stopped anywhere resumes with nothing lost or written twice.

Without ``--address`` the run starts a Ray of this machine, whose processes listen on loopback only, and stops it at
the end; a Ray already started in this process (``ray.init``) is used as it is."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from service.scoring.inputs import Source, item_row
from service.scoring.outputs import sink_for
from service.scoring.scorer import Scorer
from service.scoring.segments import DuplicateKey, Segment, segment_chunks, survey
from service.scoring.version import ScoringError

# On Linux a Ray node takes the machine's outward address unless told it is no cluster: then every process of a local
# Ray binds to 127.0.0.1 (read when Ray is imported)
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@dataclass(frozen=True)
class RayJob:
    source: Source
    output: Path
    chunk: int
    scorer: dict[str, Any]  # the ``Scorer``'s arguments, given to each actor
    address: str | None = None  # an existing cluster; None: a Ray of this machine
    actors: int | None = None  # None: as many as the cluster's CPUs (or GPUs) fit
    num_cpus: float = 1.0
    num_gpus: float = 0.0


def start_local_ray(num_cpus: int | None = None) -> None:
    """A Ray of this machine only: its processes on loopback, no dashboard."""
    os.environ[LOOPBACK_ONLY] = "0"
    import ray

    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


def chunk_table(rows: list[dict[str, Any]]) -> Any:
    """One chunk as an Arrow block: its rows' columns, a column a row lacks null in it."""
    import pyarrow as pa

    names = list(dict.fromkeys(name for row in rows for name in row))
    return pa.Table.from_pylist([{name: row.get(name) for name in names} for row in rows])


def read_segment(source: Source, segment: Segment, chunk: int) -> Iterator[Any]:
    for part in segment_chunks(source, segment, chunk):
        yield chunk_table([item_row(key, item) for key, item in part])


def chunk_source(source: Source, segments: list[Segment], chunk: int) -> Any:
    """A Ray datasource with one read task per segment, each yielding one block per chunk."""
    from ray.data import Datasource, ReadTask
    from ray.data.block import BlockMetadata

    class ChunkSource(Datasource):
        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                           data_context: Any = None) -> list[ReadTask]:
            metadata = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
            return [ReadTask(partial(read_segment, source, segment, chunk), metadata) for segment in segments]

    return ChunkSource()


def actors_for(job: RayJob) -> int:
    """``--actors``, else as many as the cluster's CPUs (and GPUs, when asked) hold."""
    import ray

    if job.actors is not None:
        return job.actors
    resources = ray.cluster_resources()
    fits = int(resources.get("CPU", 1) // job.num_cpus)
    if job.num_gpus > 0:
        fits = min(fits, int(resources.get("GPU", 0) // job.num_gpus))
    return max(fits, 1)


def scored_lines(job: RayJob, segments: list[Segment], actors: int,
                 scorer: type[Scorer] = Scorer) -> Iterator[list[dict[str, Any]]]:
    """The lines of every chunk, in input order, as Ray's actors (each a ``scorer``) score them."""
    import ray

    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # lines in input order, as the in-process scorer writes them
    context.enable_progress_bars = False  # the driver's own bar counts the lines written
    dataset = ray.data.read_datasource(chunk_source(job.source, segments, job.chunk), num_cpus=0,
                                       concurrency=actors, override_num_blocks=max(len(segments), 1))
    scored = dataset.map_batches(scorer, fn_constructor_kwargs=job.scorer, batch_size=job.chunk,
                                 batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=actors),
                                 num_cpus=job.num_cpus, num_gpus=job.num_gpus)
    for batch in scored.iter_batches(batch_size=None, batch_format="pyarrow"):
        yield [{name: value for name, value in row.items() if value is not None} for row in batch.to_pylist()]


def run_on_ray(job: RayJob) -> int:
    """The run on Ray. The version is loaded here first, as the in-process scorer loads it: a version that does not
    load, or options it cannot take, fail the run in one line (exit 2) before any actor starts."""
    import ray

    try:
        Scorer(**job.scorer)
    except ScoringError as exc:
        print(f"cannot score: {exc}", file=sys.stderr)
        return 2
    started = not ray.is_initialized()
    if started and job.address is not None:
        ray.init(address=job.address, log_to_driver=False)
    elif started:
        start_local_ray()
    sink = sink_for(job.output)
    try:
        actors = actors_for(job)
        done = sink.done()
        try:
            plan = survey(job.source, done, job.chunk, actors)
        except DuplicateKey as exc:
            print(f"cannot score: {exc}", file=sys.stderr)
            return 2
        with tqdm(total=plan.todo, unit="input", desc=f"scoring on {actors} Ray actors", file=sys.stderr) as bar:
            for lines in scored_lines(job, plan.segments, actors) if plan.todo else ():
                sink.write(lines)
                bar.update(len(lines))
        sink.finish()
    finally:
        sink.close()
        if started:
            ray.shutdown()
    print(f"{plan.todo} inputs scored into {job.output} on Ray ({len(done)} already there)", file=sys.stderr)
    return 0
