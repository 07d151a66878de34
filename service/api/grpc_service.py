"""The gRPC Open Inference Protocol (KServe's ``inference.GRPCInferenceService``, with Triton's model configuration,
statistics and repository calls) on ``DIRECTOR_GRPC_PORT``, in the same process and event loop as the HTTP server.

Every call goes through the operations HTTP uses (``service.api.inference_protocol``): the same API key (metadata
``authorization: Bearer <key>``; liveness and readiness open, as over HTTP), the same batching, limits and errors
(an HTTP status becomes its gRPC code, the message unchanged) and the same metrics: ``director_requests_total`` and
``director_request_duration_seconds`` under the endpoint ``/inference.GRPCInferenceService/<method>``, with the HTTP
status the call would have had, so one alert covers both: a cancelled or expired call is counted 499, a message that
does not parse 400 (INVALID_ARGUMENT, one rate-limited log line, no traceback), a call past
``grpc_max_concurrent_calls`` 429 (RESOURCE_EXHAUSTED). Shared memory, tracing, log settings and streaming are not
offered (UNIMPLEMENTED, counted 501)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from service.api import grpc_tensors
from service.api import inference_protocol as protocol
from service.api.auth import MESSAGE, bearer_matches
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


class Undecodable:
    """A request message that did not parse. gRPC's own deserializer would raise inside the library (UNKNOWN, an
    ERROR traceback, no count); this one hands the call its error, so the handler answers INVALID_ARGUMENT."""

    def __init__(self, error: Exception) -> None:
        self.error = f"{type(error).__name__}"


def tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # protobuf's DecodeError, or anything else a hostile message triggers
            return Undecodable(exc)

    return deserialize
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


def call(method: str, open_: bool = False) -> Callable[[Handler], Handler]:
    """A servicer method bounded in concurrency, with the API key checked (unless ``open_``), an undecodable message
    refused, errors as gRPC codes, and counted with the status it got."""

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def wrapped(self: GrpcInferenceService, request: Any, context: grpc.aio.ServicerContext) -> Any:
            started, status = time.perf_counter(), 200
            self.in_flight += 1
            try:
                if self.in_flight > self.max_calls and not open_:  # health probes are never refused for load
                    raise ApiError(429, f"more than {self.max_calls} gRPC calls at once; retry shortly")
                if not open_:
                    self.authorize(context)
                if isinstance(request, Undecodable):
                    self.log_undecodable(method, request)
                    raise ApiError(400, f"the message is not a valid {method} request ({request.error})")
                return await handler(self, request, context)
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
            # aborted outside the handlers above: an abort raised inside one would chain the error, whose traceback
            # holds the call's frames (its whole message) for as long as gRPC keeps the abort
            await context.abort(*refusal)

        return wrapped

    return decorate


class GrpcInferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, state: AppState) -> None:
        self.state = state
        self.max_calls = state.settings.grpc_max_concurrent_calls
        self.in_flight = 0
        self.last_undecodable_log = -UNDECODABLE_LOG_INTERVAL_S

    def log_undecodable(self, method: str, request: Undecodable) -> None:
        """One line at most every ``UNDECODABLE_LOG_INTERVAL_S``: a client sending garbage cannot flood the log."""
        now = time.monotonic()
        if now - self.last_undecodable_log >= UNDECODABLE_LOG_INTERVAL_S:
            self.last_undecodable_log = now
            log.warning("gRPC %s: a message that is not a valid request (%s); further ones are not logged for %gs",
                        method, request.error, UNDECODABLE_LOG_INTERVAL_S)

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
        ready = protocol.model_ready(self.state, request.name, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    @call("ServerMetadata")
    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return json_format.ParseDict(protocol.server_metadata(), pb.ServerMetadataResponse())

    @call("ModelMetadata")
    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        metadata = protocol.model_metadata(self.state, request.name, request.version or None)
        return json_format.ParseDict(metadata, pb.ModelMetadataResponse(), ignore_unknown_fields=True)

    @call("ModelConfig")
    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        config = protocol.configuration(self.state, request.name, request.version or None)
        return json_format.ParseDict({"config": config}, pb.ModelConfigResponse(), ignore_unknown_fields=True)

    @call("ModelStatistics")
    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        report = protocol.statistics(self.state, request.name or None, request.version or None)
        return json_format.ParseDict(report, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    @call("RepositoryIndex")
    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        rows = protocol.repository_index(self.state, request.ready)
        return json_format.ParseDict({"models": rows}, pb.RepositoryIndexResponse())

    @call("RepositoryModelLoad")
    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await protocol.load_model(self.state, request.model_name)
        return pb.RepositoryModelLoadResponse()

    @call("RepositoryModelUnload")
    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await protocol.unload_model(self.state, request.model_name)
        return pb.RepositoryModelUnloadResponse()

    @call("ModelInfer")
    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        body, tail = await self.state.decoder.run(grpc_tensors.request_body, request)
        answer = await protocol.infer(self.state, request.model_name, request.model_version or None, body, tail)
        return grpc_tensors.infer_response(answer.response())


def unoffered(method: str) -> Handler:
    async def refuse(self: GrpcInferenceService, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise ApiError(501, f"{method} is not offered by this server")

    refuse.__name__ = method
    return call(method)(refuse)


for _method in UNOFFERED:
    setattr(GrpcInferenceService, _method, unoffered(_method))


def method_handlers(servicer: GrpcInferenceService) -> grpc.GenericRpcHandler:
    """Every RPC of the service with a deserializer that never raises (``tolerant``), in place of the generated
    ``add_GRPCInferenceServiceServicer_to_server``."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers = {}
    for method in service.methods:
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        factory = grpc.stream_stream_rpc_method_handler if method.client_streaming else \
            grpc.unary_unary_rpc_method_handler
        handlers[method.name] = factory(getattr(servicer, method.name),
                                        request_deserializer=tolerant(request.FromString),
                                        response_serializer=response.SerializeToString)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


async def start_grpc(state: AppState, settings: Settings) -> grpc.aio.Server | None:
    """The gRPC server on ``settings.grpc_port`` (None when it is 0): messages bounded like HTTP bodies, calls bounded
    by ``grpc_max_concurrent_calls`` (counted and refused by the servicer; twice as many refused by gRPC itself before
    their messages are read, so message bytes in flight stay bounded whatever the servicer does), the port shared by
    the workers of a multi-process server (SO_REUSEPORT)."""
    if settings.grpc_port == 0:
        return None
    server = grpc.aio.server(maximum_concurrent_rpcs=2 * settings.grpc_max_concurrent_calls,
                             options=[("grpc.max_receive_message_length", settings.max_body_bytes),
                                      ("grpc.so_reuseport", 1)])
    server.add_generic_rpc_handlers((method_handlers(GrpcInferenceService(state)),))
    address = f"{settings.host}:{settings.grpc_port}"
    if server.add_insecure_port(address) == 0:
        raise RuntimeError(f"gRPC could not listen on {address}")
    await server.start()
    log.info("gRPC Open Inference Protocol on %s", address)
    return server
