"""The gRPC server (``service.api.grpc_service``) on a thread of its own, with its own event loop.

Why: gRPC copies each message it receives into Python bytes on the loop that reads it (25-35 ms for 15 MiB, holding
the GIL). On the HTTP server's loop a burst of 32 such messages queued about a second of that ahead of
``/health/live`` (docs/benchmarks.md, "gRPC memory after a burst"). On its own loop the copies still take the GIL, but
the HTTP loop gets it back between two of them and answers meanwhile.

What runs where: gRPC's loop takes the call, checks its bound and key, reads, bounds and parses its message, counts and
answers it; the handler's work runs on the main loop (``GrpcInferenceService.on_main``), where the model engine
(repository, batching, predictor) lives, which is not thread-safe. A call's cancellation (its client gone, its
deadline passed, the server stopped) cancels its work there too."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading

from service.api.grpc_service import start_grpc
from service.config import Settings
from service.state import AppState

THREAD_NAME = "director-grpc"


class GrpcThread:
    """The gRPC server's thread: ``start`` and ``stop`` are awaited on the main loop, as ``grpc.aio.Server``'s own
    were (the lifespan's startup and shutdown order is unchanged)."""

    def __init__(self, state: AppState, settings: Settings) -> None:
        self.state, self.settings = state, settings
        self.thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None  # gRPC's, once its thread runs
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stopping: asyncio.Event | None = None
        self._grace_s = settings.request_timeout_s
        self._main: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Returns once the server listens; raises what kept it from starting (a port in use)."""
        self._main = asyncio.get_running_loop()
        self.thread.start()
        await asyncio.wrap_future(self._started)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        """The thread's loop: the server made and started on it, served until ``stop``, then stopped within the
        grace (calls in progress finish; past it they are cancelled)."""
        self.loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        try:
            server = await start_grpc(self.state, self.settings, self._main)
        except Exception as exc:  # handed to ``start``, on the main loop
            self._started.set_exception(exc)
            return
        assert server is not None  # made only for a port
        self._started.set_result(None)
        await self._stopping.wait()
        await server.stop(self._grace_s)

    async def stop(self, grace_s: float | None = None) -> None:
        """No new calls; the ones in progress get ``grace_s`` to finish (their work on the main loop, which this
        awaits without blocking). Returns once the thread is gone."""
        if grace_s is not None:
            self._grace_s = grace_s
        loop, stopping = self.loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # its loop is already closed: the thread has ended
                loop.call_soon_threadsafe(stopping.set)
        await asyncio.to_thread(self.thread.join)


async def serve_grpc(state: AppState, settings: Settings) -> GrpcThread | None:
    """gRPC on its own thread, listening on ``settings.grpc_port`` once this returns (None when the port is 0)."""
    if settings.grpc_port == 0:
        return None
    served = GrpcThread(state, settings)
    await served.start()
    return served
