"""One server process: the app under uvicorn with a graceful shutdown (``service.launch`` runs one, or a
supervisor of several).

On SIGTERM/SIGINT the server first reports not-ready (``draining``) for ``shutdown_grace_s`` so a load
balancer stops sending traffic, then uvicorn stops accepting connections and waits for in-flight requests;
the lifespan then lets every queued request finish before the process exits."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn
from uvicorn.lifespan.on import LifespanOn

from service.config import Settings
from service.connections import DirectorConfig
from service.observability import logs

if TYPE_CHECKING:  # service.state brings torch: a supervisor parent, which serves nothing, goes without it
    from service.state import Lifecycle

log = logging.getLogger("service.server")
LAST_REQUESTS_S = 0.2  # after the listener closes: how long the connections it accepted last have to send a request


class DirectorServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, grace_s: float) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.grace_s = grace_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.lifecycle.draining or self.grace_s <= 0:  # second signal, or no grace period: go now
            self.lifecycle.draining = True
            super().handle_exit(sig, frame)
            return
        self.lifecycle.draining = True
        log.info("draining: not ready for %.1fs before closing the listener", self.grace_s)
        timer = threading.Timer(self.grace_s, super().handle_exit, (sig, frame))
        timer.daemon = True
        timer.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop accepting, then give the connections accepted last a moment before uvicorn's own shutdown, which
        closes at once every connection with no request in progress: a client whose connection was accepted a few
        milliseconds before the listener closed has usually sent its request, which has not been read yet, and would
        otherwise see the connection closed with no answer. Read within the moment, it is answered (with
        ``Connection: close``, as everything while draining)."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        await asyncio.sleep(LAST_REQUESTS_S)
        await super().shutdown(sockets)


class ListenOnceLoaded(LifespanOn):
    """A supervised worker's lifespan: its startup ends only once the repository's first scan is over, and uvicorn
    listens right after. The socket is shared with the other workers, so a worker still loading its models (a
    replacement for one that died, or one of the first) takes no connection it could only answer 503: the others
    take them, or the socket's backlog holds them until a worker is ready."""

    async def startup(self) -> None:
        await super().startup()
        state = getattr(self.config.app.state, "director", None)  # the lifespan built it (absent if it failed)
        if not self.should_exit and state is not None:
            await state.repository.first_scan()


def uvicorn_config(app: object, settings: Settings, **extra: object) -> DirectorConfig:
    """uvicorn refuses the connection that brings the count to ``limit_concurrency``: + 1 serves ``max_connections``."""
    return DirectorConfig(app, header_timeout_s=settings.header_timeout_s, max_header_bytes=settings.max_header_bytes,
                          max_headers=settings.max_headers, host=settings.host, port=settings.port,
                          log_level=settings.log_level, timeout_graceful_shutdown=int(settings.request_timeout_s) + 5,
                          limit_concurrency=settings.max_connections + 1, access_log=False,
                          # JSON lines: uvicorn's loggers go through the root handler instead of their own text ones
                          **({"log_config": None} if settings.log_format == "json" else {}), **extra)


def configure_logging(settings: Settings) -> None:
    logs.configure_logging(settings.log_level, settings.log_format == "json")


def serve_on(settings: Settings, sockets: list[socket.socket] | None = None) -> bool:
    """One server process (on ``sockets`` when a supervisor bound them); whether it started serving."""
    from service.app import create_app  # after the environment is final
    from service.state import Lifecycle

    configure_logging(settings)
    lifecycle = Lifecycle()
    app = create_app(settings, lifecycle)
    config = uvicorn_config(app, settings)
    if sockets is not None:  # a worker sharing the supervisor's socket: it listens only once its models loaded
        config.load()
        config.lifespan_class = ListenOnceLoaded
    server = DirectorServer(config, lifecycle, settings.shutdown_grace_s)
    server.run(sockets)
    return server.started
