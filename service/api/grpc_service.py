"""The gRPC Open Inference Protocol (KServe's ``inference.GRPCInferenceService``, with Triton's model configuration,
statistics and repository calls) on ``DIRECTOR_GRPC_PORT``, in the same process as the HTTP server, on an event loop
of its own thread (``service.api.grpc_thread`` says why); each handler's work runs on the main loop (``on_main``).

Every call goes through the operations HTTP uses (``service.api.inference_protocol``): the same API key (metadata
``authorization: Bearer <key>``; liveness and readiness open, as over HTTP), the same batching, limits and errors
(an HTTP status becomes its gRPC code, the message unchanged) and the same metrics: ``director_requests_total`` and
``director_request_duration_seconds`` under the endpoint ``/inference.GRPCInferenceService/<method>``, with the HTTP
status the call would have had, so one alert covers both: a cancelled or expired call is counted 499, a message that
does not parse 400 (INVALID_ARGUMENT, one rate-limited log line, no traceback), a call past
``grpc_max_concurrent_calls`` or a message past the bytes in progress (``service.api.grpc_messages``) 429
(RESOURCE_EXHAUSTED). Shared memory, tracing, log settings and streaming are not offered (UNIMPLEMENTED, counted 501).

Every unary RPC is served as gRPC's stream-unary kind (the same on the wire), so that a call reads its one message
itself, and only after its call bound and key are checked: a refused call never costs its message."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from service.api import grpc_tensors, inference_protocol
from service.api.auth import MESSAGE, bearer_matches
from service.api.grpc_messages import MessageBytes
from service.config import Settings
from service.errors import ApiError
from service.state import AppState

log = logging.getLogger("service.grpc")
SERVICE = "/inference.GRPCInferenceService/"
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
         403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
         408: grpc.StatusCode.DEADLINE_EXCEEDED, 409: grpc.StatusCode.FAILED_PRECONDITION,
         413: grpc.StatusCode.RESOURCE_EXHAUSTED, 422: grpc.StatusCode.INVALID_ARGUMENT,
         429: grpc.StatusCode.RESOURCE_EXHAUSTED, 501: grpc.StatusCode.UNIMPLEMENTED,
         503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}
CANCELLED = 499  # what HTTP counts for a client that went away
UNOFFERED = ("ModelStreamInfer", "SystemSharedMemoryStatus", "SystemSharedMemoryRegister",
             "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus", "CudaSharedMemoryRegister",
             "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings")
UNDECODABLE_LOG_INTERVAL_S = 10.0


Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]
Parse = Callable[[bytes], Any]
DESCRIPTOR = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def request_type(method: str) -> Any:
    return getattr(pb, DESCRIPTOR.methods_by_name[method].input_type.name)


def call(method: str, open_: bool = False, reads: bool = True, message: Any = None) -> Callable[[Handler], Handler]:
    """A servicer method bounded in concurrency, with the API key checked (unless ``open_``), then its message read
    (unless not ``reads``: the handler gets None), bounded in bytes and parsed (``message``: its type, by default the
    RPC's); errors as gRPC codes, and counted with the status it got."""
    parse: Parse | None = (message or request_type(method)).FromString if reads else None

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def wrapped(self: GrpcInferenceService, requests: Any, context: grpc.aio.ServicerContext) -> Any:
            started, status = time.perf_counter(), 200
            self.in_flight += 1
            try:
                if self.in_flight > self.max_calls and not open_:  # health probes are never refused for load
                    raise ApiError(429, f"more than {self.max_calls} gRPC calls at once; retry shortly")
                if not open_:
                    self.authorize(context)
                return await self.answer(method, handler, parse, context)
            except ApiError as exc:
                status, refusal = exc.status, (CODES.get(exc.status, grpc.StatusCode.UNKNOWN), exc.message)
            except asyncio.CancelledError:  # the client cancelled, or its deadline passed
                status = CANCELLED
                raise
            except Exception:
                if context.code() is not None:  # already aborted with its own code
                    raise
                status, refusal = 500, (grpc.StatusCode.INTERNAL, "internal error")
                log.exception("gRPC %s failed", method)
            finally:
                self.in_flight -= 1
                self.count(method, status, time.perf_counter() - started)
                self.message_bytes.settle()
            # aborted outside the handlers above: an abort raised inside one would chain the error, whose traceback
            # holds the call's frames for as long as gRPC keeps the abort (the message itself lives in ``answer``)
            await context.abort(*refusal)

        return wrapped

    return decorate


class GrpcInferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, state: AppState, main_loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.state = state
        self.main_loop = main_loop  # where the handlers' work runs; None: on the loop serving the call
        self.max_calls = state.settings.grpc_max_concurrent_calls
        self.in_flight = 0
        self.message_bytes = MessageBytes(state.settings.grpc_bytes_in_flight_limit)
        self.last_undecodable_log = -UNDECODABLE_LOG_INTERVAL_S

    async def answer(self, method: str, handler: Handler, parse: Parse | None,
                     context: grpc.aio.ServicerContext) -> Any:
        """``handler`` on the call's one message, read now, held within the bytes in progress and parsed. Only this
        frame holds the message, and it is gone by the time a refused call is aborted."""
        if parse is None:
            return await self.on_main(handler(self, None, context))
        data = await context.read()
        if data is grpc.aio.EOF:
            raise ApiError(400, f"the {method} call carried no request message")
        with self.message_bytes.hold(len(data)):
            request = await self.parse(method, parse, data)
            del data  # parsed: the message is its copy now
            return await self.on_main(handler(self, request, context))

    async def on_main(self, work: Coroutine[Any, Any, Any]) -> Any:
        """``work`` (a handler's) run on the main loop, where the model engine lives (it is not thread-safe), awaited
        here without blocking gRPC's loop; cancelling the call (its client gone, its deadline passed, the server
        stopped) cancels ``work`` there too (``wrap_future`` passes the cancellation on)."""
        main = self.main_loop
        if main is None or main is asyncio.get_running_loop():
            return await work
        try:
            done = asyncio.run_coroutine_threadsafe(work, main)
        except RuntimeError:  # the main loop is closed: the process is ending
            work.close()
            raise ApiError(503, "the server is shutting down") from None
        try:
            return await asyncio.wrap_future(done)
        finally:
            del done  # an error's traceback holds this frame: it must not hold the error back (a cycle)

    async def parse(self, method: str, parse: Parse, data: bytes) -> Any:
        """The message parsed, on gRPC's loop: protobuf holds the GIL for the whole parse (15 MiB: 2-70 ms) wherever it
        runs, so a thread would only add one more contender for it (and a malloc arena), and gRPC's loop is not the
        HTTP server's (``service.api.grpc_thread``). One that does not parse is the call's error
        (INVALID_ARGUMENT) with one log line at most every ``UNDECODABLE_LOG_INTERVAL_S``: a client sending garbage
        cannot flood the log, nor get a traceback written."""
        try:
            return parse(data)
        except Exception as exc:  # protobuf's DecodeError, or anything else a hostile message triggers
            error = type(exc).__name__
        now = time.monotonic()
        if now - self.last_undecodable_log >= UNDECODABLE_LOG_INTERVAL_S:
            self.last_undecodable_log = now
            log.warning("gRPC %s: a message that is not a valid request (%s); further ones are not logged for %gs",
                        method, error, UNDECODABLE_LOG_INTERVAL_S)
        raise ApiError(400, f"the message is not a valid {method} request ({error})")

    def authorize(self, context: grpc.aio.ServicerContext) -> None:
        header = next((value for key, value in context.invocation_metadata() or () if key == "authorization"), "")
        if not bearer_matches(self.state.settings.api_key, header.encode() if isinstance(header, str) else header):
            raise ApiError(401, MESSAGE)

    def count(self, method: str, status: int, seconds: float) -> None:
        endpoint = SERVICE + method
        self.state.metrics.requests.labels(endpoint, str(status)).inc()
        self.state.metrics.request_duration.labels(endpoint).observe(seconds)

    @call("ServerLive", open_=True)
    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return pb.ServerLiveResponse(live=True)

    @call("ServerReady", open_=True)
    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return pb.ServerReadyResponse(ready=self.state.readiness().ready)

    @call("ModelReady")
    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        ready = inference_protocol.model_ready(self.state, request.name, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    @call("ServerMetadata")
    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return json_format.ParseDict(inference_protocol.server_metadata(), pb.ServerMetadataResponse())

    @call("ModelMetadata")
    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        metadata = inference_protocol.model_metadata(self.state, request.name, request.version or None)
        return json_format.ParseDict(metadata, pb.ModelMetadataResponse(), ignore_unknown_fields=True)

    @call("ModelConfig")
    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        config = inference_protocol.configuration(self.state, request.name, request.version or None)
        return json_format.ParseDict({"config": config}, pb.ModelConfigResponse(), ignore_unknown_fields=True)

    @call("ModelStatistics")
    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        report = inference_protocol.statistics(self.state, request.name or None, request.version or None)
        return json_format.ParseDict(report, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    @call("RepositoryIndex")
    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        rows = inference_protocol.repository_index(self.state, request.ready)
        return json_format.ParseDict({"models": rows}, pb.RepositoryIndexResponse())

    @call("RepositoryModelLoad")
    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await inference_protocol.load_model(self.state, request.model_name)
        return pb.RepositoryModelLoadResponse()

    @call("RepositoryModelUnload")
    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await inference_protocol.unload_model(self.state, request.model_name)
        return pb.RepositoryModelUnloadResponse()

    @call("ModelInfer")
    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        body, tail = await self.state.decoder.run(grpc_tensors.request_body, request,
                                                  self.state.settings.max_inputs_per_request)
        answer = await inference_protocol.infer(self.state, request.model_name, request.model_version or None,
                                                body, tail)
        return grpc_tensors.infer_response(answer.response())


def unoffered(method: str) -> Handler:
    async def refuse(self: GrpcInferenceService, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise ApiError(501, f"{method} is not offered by this server")

    refuse.__name__ = method
    return call(method, reads=False)(refuse)


for _method in UNOFFERED:
    setattr(GrpcInferenceService, _method, unoffered(_method))


def method_handlers(servicer: GrpcInferenceService) -> grpc.GenericRpcHandler:
    """Every RPC of the service, in place of the generated ``add_GRPCInferenceServiceServicer_to_server``: a unary
    one as stream-unary, so that gRPC hands its handler the call before reading its message (``answer`` reads and
    parses it, after the call's checks), and no deserializer, so that a message that does not parse is the call's
    own error (gRPC's would be UNKNOWN with a traceback, uncounted)."""
    handlers = {}
    for method in DESCRIPTOR.methods:
        response = getattr(pb, method.output_type.name)
        factory = grpc.stream_stream_rpc_method_handler if method.server_streaming else \
            grpc.stream_unary_rpc_method_handler
        handlers[method.name] = factory(getattr(servicer, method.name), request_deserializer=None,
                                        response_serializer=response.SerializeToString)
    return grpc.method_handlers_generic_handler(DESCRIPTOR.full_name, handlers)


async def start_grpc(state: AppState, settings: Settings, main_loop: asyncio.AbstractEventLoop | None = None
                     ) -> grpc.aio.Server | None:
    """The gRPC server on ``settings.grpc_port`` (None when it is 0), made and started on the running loop (gRPC's
    own thread's: ``service.api.grpc_thread``), its handlers' work run on ``main_loop``: a message bounded like an HTTP
    body (gRPC refuses a larger one with RESOURCE_EXHAUSTED), calls by ``grpc_max_concurrent_calls`` and the bytes of
    messages in progress by ``grpc_max_bytes_in_flight`` (both counted and refused by the servicer; the health calls,
    exempt from the call bound, by gRPC itself past twice as many calls, before it reads their messages), the port
    shared by the workers of a multi-process server (SO_REUSEPORT)."""
    if settings.grpc_port == 0:
        return None
    server = grpc.aio.server(maximum_concurrent_rpcs=2 * settings.grpc_max_concurrent_calls,
                             options=[("grpc.max_receive_message_length", settings.max_body_bytes),
                                      ("grpc.so_reuseport", 1)])
    server.add_generic_rpc_handlers((method_handlers(GrpcInferenceService(state, main_loop)),))
    address = f"{settings.host}:{settings.grpc_port}"
    if server.add_insecure_port(address) == 0:
        raise RuntimeError(f"gRPC could not listen on {address}")
    await server.start()
    log.info("gRPC Open Inference Protocol on %s", address)
    return server
