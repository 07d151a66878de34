"""What a burst of large gRPC messages does to the server's memory: ``--clients`` concurrent ModelInfer calls of about
``--mib`` MiB each (more inputs than a request may hold, so every one is refused after its message is read), for
``--rounds`` rounds; the server's resident memory before, at its peak and after each round, each round's answers by
code and reason, and the slowest ``/health/live`` of a probe sent every 20 ms during the round (a stall of the event
loop). Calls past the concurrency bound (``DIRECTOR_GRPC_MAX_CONCURRENT_CALLS``) are refused with
RESOURCE_EXHAUSTED before their messages are read, messages past the bytes in progress
(``DIRECTOR_GRPC_MAX_BYTES_IN_FLIGHT``) before they are parsed, and the rest for their inputs. Results and what they
show: docs/benchmarks.md, "gRPC memory after a burst".

    .venv/bin/python -m benchmarks.grpc_burst --clients 32 --mib 15 --rounds 3
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import functools
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from benchmarks.server import ROOT, free_port, server_process


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def watch(pid: int, done: threading.Event, peaks: list[int]) -> None:
    """Sample the server's resident memory into ``peaks`` until ``done``."""
    while not done.is_set():
        peaks.append(resident_bytes(pid))
        time.sleep(0.02)


def probe_live(url: str, done: threading.Event, latencies: list[float]) -> None:
    """``/health/live`` every 20 ms until ``done``: how long each took."""
    with httpx.Client(base_url=url, timeout=30) as client:
        while not done.is_set():
            started = time.perf_counter()
            client.get("/health/live").raise_for_status()
            latencies.append(time.perf_counter() - started)
            done.wait(0.02)


def one_call(address: str, payload: bytes, inputs: int) -> str:
    request = pb.ModelInferRequest(model_name="fashion-vit")
    request.inputs.add(name="pixels", datatype="FP32", shape=[inputs, 1, 28, 28])
    request.raw_input_contents.append(payload)
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        try:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
            return "OK"
        except grpc.RpcError as error:
            return f"{error.code().name} ({error.details().split(';')[0][:48]})"


def burst(address: str, clients: int, mib: float, nice: int, codes: Any) -> None:
    """``clients`` concurrent calls of ``mib`` MiB, in a process of its own at CPU priority ``nice``: on a deployment
    the clients are other machines; here they share the server's cores (and, in one process, the GIL with the
    probe)."""
    os.nice(nice)
    inputs = int(mib * 2**20 / (4 * 784))
    payload = np.zeros((inputs, 1, 28, 28), dtype="<f4").tobytes()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        codes.put(list(pool.map(lambda _: one_call(address, payload, inputs), range(clients))))


def run_to_end(process: Any) -> None:
    process.start()
    process.join()


def measured(pid: int, url: str, start: int, during: Callable[[], object]) -> tuple[int, int, list[float]]:
    """Peak and final resident memory, and the ``/health/live`` latencies, around ``during()``."""
    done, peaks, live = threading.Event(), [start], []
    watchers = [threading.Thread(target=watch, args=(pid, done, peaks)),
                threading.Thread(target=probe_live, args=(url, done, live))]
    for watcher in watchers:
        watcher.start()
    during()
    done.set()
    for watcher in watchers:
        watcher.join()
    time.sleep(2.0)
    return max(peaks), resident_bytes(pid), live


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--mib", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client-nice", type=int, default=19, help="CPU priority of the clients' process")
    args = parser.parse_args(argv)
    port = free_port()
    spawn = multiprocessing.get_context("spawn")
    with server_process(args.repository, "fashion-vit", 1, ["--grpc-port", str(port)]) as (proc, url):
        start = resident_bytes(proc.pid)
        *_, idle = measured(proc.pid, url, start, lambda: time.sleep(3.0))
        print(f"start: {start / 2**20:.0f} MiB resident; /health/live idle, slowest {max(idle) * 1000:.0f} ms of "
              f"{len(idle)}; load average {os.getloadavg()[0]:.1f}")
        for round_ in range(1, args.rounds + 1):
            codes = spawn.Queue()
            clients = spawn.Process(target=burst, args=(f"127.0.0.1:{port}", args.clients, args.mib,
                                                        args.client_nice, codes))
            peak, after, live = measured(proc.pid, url, start, functools.partial(run_to_end, clients))
            print(f"round {round_}: {dict(collections.Counter(codes.get(timeout=60)))}; peak "
                  f"{peak / 2**20:.0f} MiB, after {after / 2**20:.0f} MiB ({(after - start) / 2**20:+.0f} MiB over "
                  f"the start); /health/live slowest {max(live) * 1000:.0f} ms of {len(live)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
