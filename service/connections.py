"""uvicorn's HTTP protocol (httptools) with what it lacks for slow or hostile clients and for a drain.

- A header read timeout. uvicorn times out idle keep-alive connections, but not a connection that opens and sends
  nothing, or sends half a request line and stalls: each would hold a connection (and a file descriptor) for ever.
  Here a request's headers must be complete ``header_timeout_s`` after the connection opened or after the
  request's first byte; otherwise the client gets 408 (the JSON error shape) and the connection is closed.
- Header limits. httptools buffers a request's line and headers however long they grow (a 64 MB header was
  answered 200): past ``max_header_bytes`` received before the headers end, or ``max_headers`` fields, the client
  gets 431 and the connection is closed, so what one connection holds is bounded before any route runs.
- A shutdown that answers what already reached the server. On shutdown uvicorn closes every connection that has
  no response under way, even one whose next request is half parsed or waiting unread in the socket buffer: that
  client is reset with no answer. Here such a connection stays open until its request is answered (with
  ``Connection: close``, see ``service.api.gateway``); only connections with nothing received
  are closed at once. A request still on the network when its connection closes cannot be helped by the server:
  it never reached it, and the client sees a connection closed before any byte of a response (safe to retry).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.errors import error_response


class DirectorConfig(uvicorn.Config):
    """``uvicorn.Config`` with our protocol and its header timeout (the Config is what reaches worker processes)."""

    def __init__(self, app: Any, header_timeout_s: float = 10.0, max_header_bytes: int = 32_768,
                 max_headers: int = 100, **kwargs: Any) -> None:
        super().__init__(app, http=DirectorHttpProtocol, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers


def _closing_response(status: int, reason: str, message: str) -> bytes:
    """A complete HTTP/1.1 error response in the JSON error shape, closing the connection."""
    response = error_response(status, message)
    head = [f"HTTP/1.1 {status} {reason}".encode(), b"content-type: application/json",
            b"content-length: " + str(len(response.body)).encode(), b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + bytes(response.body)


def _timeout_response(timeout_s: float) -> bytes:
    return _closing_response(408, "Request Timeout", f"request headers not received within {timeout_s:g} s")


def _unread_bytes(transport: asyncio.Transport) -> bool:
    """Whether the peer sent bytes the event loop has not read yet (peeked on a duplicate of the socket)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        with socket.fromfd(sock.fileno(), sock.family, sock.type) as dup:
            return bool(dup.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # nothing to read (BlockingIOError), or the socket is gone
        return False


class DirectorHttpProtocol(HttpToolsProtocol):
    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.header_timeout_s: float = getattr(config, "header_timeout_s", 10.0)
        self.max_header_bytes: int = getattr(config, "max_header_bytes", 32_768)
        self.max_headers: int = getattr(config, "max_headers", 100)
        self._header_timer: asyncio.TimerHandle | None = None
        self._in_request = False  # between a request's first byte and the end of its response
        self._in_headers = True  # the next bytes belong to a request line or headers
        self._header_bytes = 0  # received since the current request's headers began
        self._header_count = 0
        self._too_many_headers = False  # answered 431 once the headers end (the parser cannot be stopped midway)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        counted = self._in_headers  # bytes past the headers' end in the same read are counted too: one read at most
        super().data_received(data)
        if counted and self._in_headers and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._refuse_headers(f"request line and headers larger than {self.max_header_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_request = True
        # counted per request; not at the previous response's end, when its unread body may still be arriving
        self._in_headers, self._header_count, self._too_many_headers = True, 0, False
        self._header_bytes = 0
        if self._header_timer is None:
            self._arm_header_timer()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.max_headers:
            self._too_many_headers = True  # the rest are dropped; the request never reaches the app
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        self._in_headers = False
        if self._too_many_headers:
            self._refuse_headers(f"more than {self.max_headers} header fields")
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._too_many_headers:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._too_many_headers:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        self._in_request = False
        super().on_response_complete()

    def _refuse_headers(self, message: str) -> None:
        if self.transport.is_closing() or not (self.cycle is None or self.cycle.response_complete):
            return
        self._cancel_header_timer()
        self.transport.write(_closing_response(431, "Request Header Fields Too Large", message))
        self.transport.close()

    def shutdown(self) -> None:
        idle = self.cycle is None or self.cycle.response_complete
        if idle and (self._in_request or _unread_bytes(self.transport)):
            return  # a request reached us: it is answered, then the connection closes (Connection: close)
        super().shutdown()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not (self.cycle is None or self.cycle.response_complete):
            return  # closed already, or a response is being written (a pipelined request waits behind it)
        self.transport.write(_timeout_response(self.header_timeout_s))
        self.transport.close()
