"""The server's memory after a burst of large gRPC messages, in a real process: it comes back to where it was. A burst
of 32 messages of 15 MiB left the server 0.9-1.4 GiB over its start for good: gRPC read every message before the
servicer could refuse its call, the refused calls' frames held their messages in reference cycles, and glibc kept the
pages of the freed ones. The figures for the default models: ``python -m benchmarks.grpc_burst``."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tests.service.conftest import wait_for
from tests.service.test_process import free_port, service_process

MIB = 1 << 20
INPUTS = 4000  # 12 MiB of FP32 28 x 28 images: past the 256 inputs a request may hold, refused once parsed


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def infer(address: str, inputs: int) -> str:
    request = pb.ModelInferRequest(model_name="tiny")
    request.inputs.add(name="pixels", datatype="FP32", shape=[inputs, 1, 28, 28])
    request.raw_input_contents.append(bytes(inputs * 784 * 4))
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 * MIB)]) as channel:
        try:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
        except grpc.RpcError as error:
            return error.code().name
    return "OK"


def test_memory_comes_back_after_a_burst_of_large_messages(tiny_repository: Path, tmp_path: Path) -> None:
    port = free_port()
    args = ["--model-repository", str(tiny_repository), "--default-model", "tiny", "--torch-threads", "1",
            "--poll-interval-s", "0", "--feedback-db", str(tmp_path / "feedback.sqlite3"), "--grpc-port", str(port),
            "--log-level", "warning"]
    with service_process(args, {}) as (proc, _):
        address = f"127.0.0.1:{port}"
        assert infer(address, 1) == "OK"  # the first call's one-off allocations (pools, channels) before the start
        start = resident_bytes(proc.pid)
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            codes = set(pool.map(lambda _: infer(address, INPUTS), range(24)))
        assert codes == {"RESOURCE_EXHAUSTED"}, codes
        over = [0]

        def back() -> bool:
            over[0] = resident_bytes(proc.pid) - start
            return over[0] < 100 * MIB

        wait_for(back, "the server's memory back within 100 MiB of its start", timeout_s=30)
