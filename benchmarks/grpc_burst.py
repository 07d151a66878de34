"""What a burst of large gRPC messages does to the server's memory: ``--clients`` concurrent ModelInfer calls of about
``--mib`` MiB each (more inputs than a request may hold, so every one is refused after its message is read), for
``--rounds`` rounds; the server's resident memory before, at its peak and after each round. Calls past the
concurrency bound (``DIRECTOR_GRPC_MAX_CONCURRENT_CALLS``) are refused with RESOURCE_EXHAUSTED.

    .venv/bin/python -m benchmarks.grpc_burst --clients 32 --mib 15 --rounds 3
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import threading
import time
from pathlib import Path

import grpc
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


def one_call(address: str, payload: bytes, inputs: int) -> str:
    request = pb.ModelInferRequest(model_name="fashion-vit")
    request.inputs.add(name="pixels", datatype="FP32", shape=[inputs, 1, 28, 28])
    request.raw_input_contents.append(payload)
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        try:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
            return "OK"
        except grpc.RpcError as error:
            return error.code().name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--mib", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    inputs = int(args.mib * 2**20 / (4 * 784))
    payload = np.zeros((inputs, 1, 28, 28), dtype="<f4").tobytes()
    port = free_port()
    with server_process(args.repository, "fashion-vit", 1, ["--grpc-port", str(port)]) as (proc, _):
        address = f"127.0.0.1:{port}"
        start = resident_bytes(proc.pid)
        print(f"start: {start / 2**20:.0f} MiB resident")
        for round_ in range(1, args.rounds + 1):
            done = threading.Event()
            peaks = [start]
            watcher = threading.Thread(target=watch, args=(proc.pid, done, peaks))
            watcher.start()
            with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                codes = list(pool.map(lambda _: one_call(address, payload, inputs), range(args.clients)))
            done.set()
            watcher.join()
            peak = max(peaks)
            time.sleep(2.0)
            after = resident_bytes(proc.pid)
            print(f"round {round_}: {dict(collections.Counter(codes))}; peak {peak / 2**20:.0f} MiB, after "
                  f"{after / 2**20:.0f} MiB ({(after - start) / 2**20:+.0f} MiB over the start)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
