"""gRPC calls a hostile or careless client makes: a message that does not parse gets INVALID_ARGUMENT (it was
UNKNOWN with an ERROR traceback, uncounted), an RPC the server does not offer UNIMPLEMENTED with a plain message (it
was "Unexpected NotImplementedError"), an OIP id longer than HTTP's bound is refused (one 1 MiB id was stored with
every input of the request), and every call is counted with the status it got: a cancelled one 499 (it was 200), one
past the concurrency bound or the bytes of messages in progress 429 (RESOURCE_EXHAUSTED; refused before the message
is read, or before it is parsed), and the pages of large messages are handed back once they are gone. The wire cases
run against a real server; the cancellation, the bounds and the trim against the servicer's own parts, where their
timing is in the test's hands."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from service.api.grpc_messages import LARGE_MESSAGE_BYTES, MessageBytes, Trimmer
from service.api.grpc_service import SERVICE, GrpcInferenceService, call
from service.config import Settings
from service.observability.metrics import Metrics
from tests.service.conftest import Running, metric_value, serve, settings_for, until, wait_for
from tests.service.test_feedback_metrics import stored_id_characters
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
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as error:  # a stream of none
        channel.stream_unary(SERVICE + "ServerLive")(iter(()), timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "carried no request message" in str(error.value)


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


def test_a_large_message_is_parsed_off_the_event_loop_with_the_same_answers(server: tuple[Running, str]) -> None:
    """A message of a MiB or more is parsed on gRPC's own loop, not the HTTP server's (15 MiB took 10-70 ms on the
    shared loop): a valid one gets the infer request's own refusal (too many inputs), garbage INVALID_ARGUMENT, as a
    small one would."""
    running, address = server
    many = pb.ModelInferRequest(model_name="tiny")
    many.inputs.add(name="pixels", datatype="FP32", shape=[400, 1, 28, 28])
    many.raw_input_contents.append(bytes(400 * 784 * 4))
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as error:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(many, metadata=tuple(AUTH.items()), timeout=30)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "400 inputs" in error.value.details()
    garbage = raw_call(address, "ModelInfer", b"\xff" * (1 << 20), tuple(AUTH.items()))
    assert garbage.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a valid ModelInfer" in garbage.details()


def test_a_calls_id_is_stored_once_for_all_its_inputs(server: tuple[Running, str]) -> None:
    """One call with a 128-character id and 256 inputs stores the id once (a 1 MiB id with 256 texts grew the SQLite
    store by 499 MB, the id in every row)."""
    running, address = server
    store = running.app_state.feedback
    before = stored_id_characters(store)
    request = pb.ModelInferRequest(model_name="tiny", id="k" * 128)
    request.inputs.add(name="pixels", datatype="FP32", shape=[256, 1, 28, 28])
    request.raw_input_contents.append(bytes(256 * 784 * 4))
    request.parameters["n_samples"].int64_param = 1
    with grpc.insecure_channel(address) as channel:
        answer = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=tuple(AUTH.items()),
                                                                      timeout=60)
    assert answer.id == "k" * 128 and store.prediction_of("k" * 128) is not None
    assert stored_id_characters(store) - before == 128


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


def test_a_message_past_the_bytes_in_progress_is_resource_exhausted_on_the_wire(
        tiny_repository: Path, tmp_path: Path) -> None:
    """A real server, its forwards held (the device lock) while one 200 KB call waits for its batch: a second message
    of 100 KB would pass the 256 KiB in progress and is refused at once, before it is parsed; the first is answered."""
    port = free_port()
    settings = settings_for(tiny_repository, tmp_path, grpc_port=port, max_body_bytes=256 * 1024,
                            grpc_max_bytes_in_flight=256 * 1024)
    held = pb.ModelInferRequest(model_name="tiny")
    held.inputs.add(name="pixels", datatype="FP32", shape=[64, 1, 28, 28])
    held.raw_input_contents.append(bytes(64 * 784 * 4))
    with serve(settings) as running, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        worker = running.app_state.repository.get("tiny", None).worker
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        lock = running.app_state.device.lock
        lock.acquire()
        try:
            first = stub.ModelInfer.future(held, timeout=60)
            wait_for(lambda: not worker.idle, "the first call's forward")
            error = raw_call(f"127.0.0.1:{port}", "ModelInfer", b"\xff" * (100 * 1024))
        finally:
            lock.release()
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        assert "would pass 262144 bytes" in error.details()
        assert list(first.result().outputs) and counted(running, "ModelInfer", "429") == 1


class Aborted(Exception):
    """What ``ServicerContext.abort`` raises."""


class Context:
    def __init__(self, message: bytes = b"") -> None:
        self.aborted: list[grpc.StatusCode] = []
        self.message, self.reads = message, 0

    def invocation_metadata(self) -> tuple:
        return ()

    async def read(self) -> bytes:
        self.reads += 1
        return self.message

    def code(self) -> grpc.StatusCode | None:
        return self.aborted[-1] if self.aborted else None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted.append(code)
        raise Aborted(details)


def servicer(max_calls: int, **settings: Any) -> GrpcInferenceService:
    state = SimpleNamespace(settings=Settings(grpc_max_concurrent_calls=max_calls, **settings), metrics=Metrics())
    return GrpcInferenceService(state)  # type: ignore[arg-type]


def count_of(service: GrpcInferenceService, method: str, code: str) -> float:
    value = service.state.metrics.registry.get_sample_value(
        "director_requests_total", {"endpoint": SERVICE + method, "code": code})
    return value or 0.0


def test_a_cancelled_call_is_counted_499() -> None:
    @call("Slow", message=pb.ServerLiveRequest)
    async def slow(self: GrpcInferenceService, request: Any, context: Context) -> None:
        await asyncio.Event().wait()

    async def run() -> GrpcInferenceService:
        service = servicer(4)
        task = asyncio.ensure_future(slow(service, None, Context()))
        await asyncio.sleep(0)  # the call is under way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return service

    service = asyncio.run(run())
    assert count_of(service, "Slow", "499") == 1 and count_of(service, "Slow", "200") == 0
    assert service.in_flight == 0


def test_calls_past_the_bound_are_resource_exhausted_and_counted_429() -> None:
    @call("Held", message=pb.ServerLiveRequest)
    async def held(self: GrpcInferenceService, request: Any, context: Context) -> str:
        await release.wait()
        return "done"

    async def run() -> tuple[GrpcInferenceService, Context, list[Any]]:
        service = servicer(2)
        first = [asyncio.ensure_future(held(service, None, Context())) for _ in range(2)]
        await asyncio.sleep(0)
        refused = Context()
        with pytest.raises(Aborted, match="more than 2 gRPC calls at once"):
            await held(service, None, refused)
        release.set()
        return service, refused, await asyncio.gather(*first)

    release = asyncio.Event()
    service, refused, answers = asyncio.run(run())
    assert answers == ["done", "done"] and refused.aborted == [grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert refused.reads == 0  # refused before its message was read: gRPC read every message before the handler
    assert count_of(service, "Held", "429") == 1 and count_of(service, "Held", "200") == 2
    assert service.in_flight == 0


def test_message_bytes_past_the_bound_are_refused_before_they_are_parsed() -> None:
    """A message that would take the bytes in progress past ``grpc_max_bytes_in_flight`` is refused with
    RESOURCE_EXHAUSTED, counted 429, before it is parsed (garbage gets no INVALID_ARGUMENT); one that fits beside the
    held one is served, and every byte is given back when the calls end. There was no bound on bytes: 32 calls of
    15 MiB took the server from 1.0 to 2.7 GB."""

    @call("Held", message=pb.ModelInferRequest)
    async def held(self: GrpcInferenceService, request: Any, context: Context) -> int:
        await release.wait()
        return len(request.raw_input_contents[0]) if request.raw_input_contents else 0

    big = pb.ModelInferRequest(raw_input_contents=[bytes(40 * 1024)]).SerializeToString()
    small = pb.ModelInferRequest(raw_input_contents=[bytes(16)]).SerializeToString()

    async def run() -> tuple[GrpcInferenceService, Context, list[int], int]:
        service = servicer(8, max_body_bytes=64 * 1024, grpc_max_bytes_in_flight=64 * 1024)
        first = asyncio.ensure_future(held(service, None, Context(big)))
        await until(lambda: service.message_bytes.held > 0, "the message held")
        refused = Context(b"\xff" * (30 * 1024))
        with pytest.raises(Aborted, match="would pass 65536 bytes"):
            await held(service, None, refused)
        beside = asyncio.ensure_future(held(service, None, Context(small)))
        await until(lambda: service.message_bytes.held > len(big), "both messages held")
        holding = service.message_bytes.held
        release.set()
        return service, refused, list(await asyncio.gather(first, beside)), holding

    release = asyncio.Event()
    service, refused, answers, holding = asyncio.run(run())
    assert refused.aborted == [grpc.StatusCode.RESOURCE_EXHAUSTED] and refused.reads == 1
    assert answers == [40 * 1024, 16] and holding == len(big) + len(small)
    assert count_of(service, "Held", "429") == 1 and count_of(service, "Held", "200") == 2
    assert service.message_bytes.held == 0 and service.in_flight == 0


def test_a_bytes_bound_below_the_largest_message_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="below max_body_bytes"):
        Settings(max_body_bytes=1 << 20, grpc_max_bytes_in_flight=1 << 19)
    assert Settings(max_body_bytes=1 << 20).grpc_bytes_in_flight_limit == 4 << 20


def test_a_call_without_the_key_is_refused_before_its_message_is_read() -> None:
    from pydantic import SecretStr

    @call("Keyed", message=pb.ModelInferRequest)
    async def keyed(self: GrpcInferenceService, request: Any, context: Context) -> str:
        return "served"

    service = servicer(4, api_key=SecretStr("k"))
    context = Context(bytes(1024))
    with pytest.raises(Aborted):
        asyncio.run(keyed(service, None, context))
    assert context.aborted == [grpc.StatusCode.UNAUTHENTICATED] and context.reads == 0
    assert count_of(service, "Keyed", "401") == 1


def test_freed_pages_are_handed_back_once_the_last_large_message_is_gone() -> None:
    """glibc kept the pages of freed messages (a burst of 32 x 15 MiB left 0.9-1.4 GiB resident): one trim runs once
    no message is held after a large one, another if a large one went while it ran, none for small messages."""
    started, proceed = threading.Event(), threading.Event()
    trims: list[int] = []

    def release_pages() -> None:
        trims.append(len(trims))
        started.set()
        proceed.wait(timeout=30)

    async def run() -> Trimmer:
        trimmer = Trimmer(release_pages)
        ledger = MessageBytes(64 << 20, trimmer)
        with ledger.hold(1024):
            ledger.settle()
        assert not trimmer.running  # small messages never ask
        with ledger.hold(LARGE_MESSAGE_BYTES), ledger.hold(LARGE_MESSAGE_BYTES):
            pass
        ledger.settle()
        assert trimmer.running
        await asyncio.to_thread(started.wait, 30)
        with ledger.hold(2 * LARGE_MESSAGE_BYTES):  # a large one while the trim runs: one more trim after it
            ledger.settle()  # still held: no trim asked yet
        ledger.settle()
        proceed.set()
        await until(lambda: not trimmer.running and trimmer.trims == 2, "two trims")
        return trimmer

    trimmer = asyncio.run(run())
    assert trims == [0, 1] and trimmer.trims == 2 and not trimmer.due


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
