"""gRPC on a thread and event loop of its own (``service.api.grpc_thread``), over a real server: HTTP is answered
while gRPC's loop is held (there gRPC copies each message it receives, 25-35 ms for 15 MiB holding the GIL: on the
shared loop a burst of them stalled ``/health/live`` for a second) and while a gRPC call's work waits on the main
loop, and a shutdown lets a gRPC call in flight finish before the thread ends."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from service.api.grpc_service import SERVICE, GrpcInferenceService, call
from service.api.grpc_thread import THREAD_NAME, GrpcThread
from tests.service.conftest import Running, serve, settings_for, wait_for
from tests.service.test_grpc import free_port
from tests.service.test_grpc_faults import Context, count_of, servicer


def grpc_of(running: Running) -> GrpcThread:
    served = running.server.config.app.state.grpc
    assert isinstance(served, GrpcThread) and served.thread.name == THREAD_NAME and served.thread.is_alive()
    return served


def live(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(), timeout=30).live


def refuses_new_calls(address: str) -> bool:
    """Whether a new call is refused (UNAVAILABLE): the gRPC server was asked to stop."""
    try:
        live(address)
    except grpc.RpcError as error:
        return error.code() == grpc.StatusCode.UNAVAILABLE
    return False


def test_http_is_answered_while_grpcs_loop_is_held(tiny_repository: Path, tmp_path: Path) -> None:
    port = free_port()
    with serve(settings_for(tiny_repository, tmp_path, grpc_port=port)) as running:
        served = grpc_of(running)
        assert served.loop is not None
        held, release = threading.Event(), threading.Event()

        def hold() -> None:  # gRPC's loop, busy as with a message's copy (the GIL is given up while it waits)
            held.set()
            release.wait(timeout=60)

        served.loop.call_soon_threadsafe(hold)
        try:
            assert held.wait(timeout=30)
            answer = httpx.get(f"{running.url}/health/live", timeout=30)
            assert answer.status_code == 200 and not release.is_set()
        finally:
            release.set()
        assert live(f"127.0.0.1:{port}")  # gRPC answers again once its loop is free


def test_a_grpc_call_in_flight_is_answered_through_a_shutdown(tiny_repository: Path, tmp_path: Path) -> None:
    """A ModelInfer call's work on the main loop waits for the device (its lock held): HTTP and gRPC still answer;
    the server is then shut down, and once gRPC refuses new calls the device is freed: the call is answered, counted
    200, and the gRPC thread ends with the server."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    request = pb.ModelInferRequest(model_name="tiny")
    request.inputs.add(name="pixels", datatype="FP32", shape=[2, 1, 28, 28])
    request.raw_input_contents.append(bytes(2 * 784 * 4))
    with serve(settings_for(tiny_repository, tmp_path, grpc_port=port)) as running, \
            grpc.insecure_channel(address) as channel:
        served = grpc_of(running)
        worker = running.app_state.repository.get("tiny", None).worker
        lock = running.app_state.device.lock
        lock.acquire()
        try:
            call = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer.future(request, timeout=120)
            wait_for(lambda: not worker.idle, "the call's forward")
            assert httpx.get(f"{running.url}/health/live", timeout=30).status_code == 200
            assert live(address)
            running.server.should_exit = True  # HTTP stops, then gRPC gets the request timeout for its calls
            wait_for(lambda: refuses_new_calls(address), "gRPC refusing new calls")
            assert not call.done()
        finally:
            lock.release()
        assert list(call.result().outputs)
    assert not served.thread.is_alive()
    registry = running.app_state.metrics.registry
    assert registry.get_sample_value("director_requests_total",
                                     {"endpoint": SERVICE + "ModelInfer", "code": "200"}) == 1


def test_cancelling_a_call_cancels_its_work_on_the_main_loop() -> None:
    """The handler's work runs on the main loop; the call cancelled on gRPC's (its client gone, its deadline passed)
    cancels it there, and the call is counted 499."""
    main = asyncio.new_event_loop()
    main_thread = threading.Thread(target=main.run_forever, daemon=True)
    main_thread.start()
    started, cancelled = threading.Event(), threading.Event()
    ran_on: list[asyncio.AbstractEventLoop] = []

    @call("Slow", message=pb.ServerLiveRequest)
    async def slow(self: GrpcInferenceService, request: Any, context: Context) -> None:
        ran_on.append(asyncio.get_running_loop())
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def run() -> GrpcInferenceService:
        service = servicer(4)
        service.main_loop = main
        task = asyncio.ensure_future(slow(service, None, Context()))
        assert await asyncio.to_thread(started.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return service

    try:
        service = asyncio.run(run())
        assert cancelled.wait(timeout=30)
    finally:
        main.call_soon_threadsafe(main.stop)
        main_thread.join(timeout=30)
        main.close()
    assert ran_on == [main]
    assert count_of(service, "Slow", "499") == 1 and count_of(service, "Slow", "200") == 0 and service.in_flight == 0
