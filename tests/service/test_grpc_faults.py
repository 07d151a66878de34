"""gRPC calls a hostile or careless client makes: a message that does not parse gets INVALID_ARGUMENT (it was
UNKNOWN with an ERROR traceback, uncounted), an RPC the server does not offer UNIMPLEMENTED with a plain message (it
was "Unexpected NotImplementedError"), an OIP id longer than HTTP's bound is refused (one 1 MiB id was stored with
every input of the request), and every call is counted with the status it got: a cancelled one 499 (it was 200), one
past the concurrency bound 429 (RESOURCE_EXHAUSTED). The wire cases run against a real server; the cancellation and
the concurrency bound against the servicer's own wrapper, where their timing is in the test's hands."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from service.api.grpc_service import SERVICE, GrpcInferenceService, call
from service.config import Settings
from service.observability.metrics import Metrics
from tests.service.conftest import Running, metric_value, serve, settings_for
from tests.service.test_grpc import AUTH, KEY, free_port


@pytest.fixture(scope="module")
def server(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, str]]:
    tmp = tmp_path_factory.mktemp("grpc-faults")
    port = free_port()
    with serve(settings_for(tiny_repository, tmp, grpc_port=port, api_key=KEY)) as running:
        yield running, f"127.0.0.1:{port}"


def raw_call(address: str, method: str, payload: bytes, metadata: tuple = ()) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        rpc = channel.unary_unary(SERVICE + method, request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as error:
            rpc(payload, metadata=metadata, timeout=30)
    return error.value


def counted(server: Running, method: str, code: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return metric_value(text, "director_requests_total", endpoint=SERVICE + method, code=code) or 0.0


def test_a_message_that_does_not_parse_is_invalid_argument_and_counted(server: tuple[Running, str]) -> None:
    running, address = server
    garbage = b"\xff\xff\xff\xff\x0f"
    for method, metadata in (("ServerLive", ()), ("ModelInfer", tuple(AUTH.items()))):
        error = raw_call(address, method, garbage, metadata)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert f"not a valid {method} request" in error.details()
        assert counted(running, method, "400") >= 1
    assert raw_call(address, "ModelInfer", garbage).code() == grpc.StatusCode.UNAUTHENTICATED  # the key first


def test_an_rpc_not_offered_is_unimplemented_with_a_plain_message(server: tuple[Running, str]) -> None:
    running, address = server
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for rpc, request in ((stub.SystemSharedMemoryStatus, pb.SystemSharedMemoryStatusRequest()),
                             (stub.LogSettings, pb.LogSettingsRequest())):
            with pytest.raises(grpc.RpcError) as error:
                rpc(request, metadata=tuple(AUTH.items()), timeout=30)
            assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "is not offered by this server" in error.value.details()
    assert counted(running, "LogSettings", "501") >= 1


def test_an_oip_id_longer_than_http_allows_is_refused(server: tuple[Running, str]) -> None:
    running, address = server
    request = pb.ModelInferRequest(model_name="tiny", id="x" * 129)
    request.inputs.add(name="pixels", datatype="FP32", shape=[1, 1, 28, 28]).contents.fp32_contents.extend(
        [0.5] * 784)
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as error:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=tuple(AUTH.items()), timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "id must be at most 128 characters" in error.value.details()
    body = {"id": "y" * 129, "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 1, 28, 28],
                                       "data": [0.5] * 784}]}
    answer = httpx.post(f"{running.url}/v2/models/tiny/infer", json=body, headers=AUTH, timeout=30)
    assert answer.status_code == 422 and "at most 128 characters" in answer.text


def test_a_tensor_sent_both_raw_and_typed_is_refused(server: tuple[Running, str]) -> None:
    """The raw bytes were taken and the typed contents dropped without a word."""
    request = pb.ModelInferRequest(model_name="tiny")
    request.inputs.add(name="pixels", datatype="FP32", shape=[1, 1, 28, 28]).contents.fp32_contents.extend(
        [0.5] * 784)
    request.raw_input_contents.append(bytes(4 * 784))
    with grpc.insecure_channel(server[1]) as channel, pytest.raises(grpc.RpcError) as error:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=tuple(AUTH.items()), timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "both in typed contents and in raw_input_contents" in error.value.details()


class Aborted(Exception):
    """What ``ServicerContext.abort`` raises."""


class Context:
    def __init__(self) -> None:
        self.aborted: list[grpc.StatusCode] = []

    def invocation_metadata(self) -> tuple:
        return ()

    def code(self) -> grpc.StatusCode | None:
        return self.aborted[-1] if self.aborted else None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted.append(code)
        raise Aborted(details)


def servicer(max_calls: int) -> GrpcInferenceService:
    state = SimpleNamespace(settings=Settings(grpc_max_concurrent_calls=max_calls), metrics=Metrics())
    return GrpcInferenceService(state)  # type: ignore[arg-type]


def count_of(service: GrpcInferenceService, method: str, code: str) -> float:
    value = service.state.metrics.registry.get_sample_value(
        "director_requests_total", {"endpoint": SERVICE + method, "code": code})
    return value or 0.0


def test_a_cancelled_call_is_counted_499() -> None:
    @call("Slow")
    async def slow(self: GrpcInferenceService, request: Any, context: Context) -> None:
        await asyncio.Event().wait()

    async def run() -> GrpcInferenceService:
        service = servicer(4)
        task = asyncio.ensure_future(slow(service, pb.ServerLiveRequest(), Context()))
        await asyncio.sleep(0)  # the call is under way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return service

    service = asyncio.run(run())
    assert count_of(service, "Slow", "499") == 1 and count_of(service, "Slow", "200") == 0
    assert service.in_flight == 0


def test_calls_past_the_bound_are_resource_exhausted_and_counted_429() -> None:
    @call("Held")
    async def held(self: GrpcInferenceService, request: Any, context: Context) -> str:
        await release.wait()
        return "done"

    async def run() -> tuple[GrpcInferenceService, Context, list[Any]]:
        service = servicer(2)
        first = [asyncio.ensure_future(held(service, pb.ServerLiveRequest(), Context())) for _ in range(2)]
        await asyncio.sleep(0)
        refused = Context()
        with pytest.raises(Aborted, match="more than 2 gRPC calls at once"):
            await held(service, pb.ServerLiveRequest(), refused)
        release.set()
        return service, refused, await asyncio.gather(*first)

    release = asyncio.Event()
    service, refused, answers = asyncio.run(run())
    assert answers == ["done", "done"] and refused.aborted == [grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert count_of(service, "Held", "429") == 1 and count_of(service, "Held", "200") == 2
    assert service.in_flight == 0


def test_a_load_that_an_unload_overtook_says_so() -> None:
    """A ``load`` racing an ``unload`` of the same model answered 400 "has no version that loaded"."""
    from pydantic import SecretStr

    from service.api.inference_protocol import load_model
    from service.errors import ApiError

    class Repository:
        unloaded: set[str] = set()

        async def load(self, name: str) -> bool:
            self.unloaded.add(name)  # the unload ran while this load's scan awaited
            return True

        def default_version(self, name: str) -> None:
            return None

    state = SimpleNamespace(settings=Settings(api_key=SecretStr("k")), repository=Repository())
    with pytest.raises(ApiError) as refused:
        asyncio.run(load_model(state, "tiny"))  # type: ignore[arg-type]
    assert refused.value.status == 409 and "was unloaded while it loaded" in refused.value.message
