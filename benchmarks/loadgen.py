"""A lean HTTP/1.1 load generator for loopback benchmarks: pre-encoded requests on raw asyncio streams.

Why not httpx here: at hundreds of requests per second an httpx client spends more CPU per request than
the server does to refuse one, so on a 2-core machine the generator, not the server, sets the latency it
reports (measured: 128 closed-loop httpx clients saw refusals at p50 1.3 s while the server answered them
in 0.16 s from ASGI entry). This client sends bytes encoded once and parses only the status line and
Content-Length, so its own cost stays small.

``open_loop`` offers Poisson arrivals at a fixed rate whatever the server does (the way real traffic
arrives) and measures each latency from the request's *scheduled* arrival, so a generator or server that
falls behind is charged for it (no coordinated omission). ``closed_loop`` runs N clients back to back."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np


def encode_post(url: str, path: str, body: dict[str, Any]) -> bytes:
    """One keep-alive POST with a JSON body, as bytes on the wire."""
    return encode_request(url, path, json.dumps(body, separators=(",", ":")).encode(), "application/json")


def encode_request(url: str, path: str, payload: bytes, content_type: str,
                   headers: dict[str, str] | None = None) -> bytes:
    """One keep-alive POST of ``payload`` (any content type, extra ``headers``), as bytes on the wire."""
    host = urlsplit(url).netloc
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n{extra}"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    return head + payload


class Connection:
    """One keep-alive connection; ``request`` sends pre-encoded bytes and returns the status code."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.open = True

    @classmethod
    async def connect(cls, url: str) -> Connection:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        return cls(reader, writer)

    async def request(self, raw: bytes) -> int:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                self.open = False
        if length:
            await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.open = False
        self.writer.close()


@dataclass
class Tally:
    """Latencies (seconds) by status code; ``errors`` counts transport failures."""

    latencies: dict[int, list[float]] = field(default_factory=dict)
    errors: int = 0
    send_delays: list[float] = field(default_factory=list)  # open loop: actual send - scheduled arrival

    def add(self, status: int, seconds: float) -> None:
        self.latencies.setdefault(status, []).append(seconds)

    def summary(self, wall_s: float) -> dict[str, Any]:
        def pct(values: list[float]) -> dict[str, float | None]:
            if not values:
                return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
            ms = np.asarray(values) * 1000.0
            return {f"p{q}_ms": round(float(np.percentile(ms, q)), 2) for q in (50, 95, 99)}

        ok = self.latencies.get(200, [])
        refused = [s for code, values in self.latencies.items() if code != 200 for s in values]
        every = [s for values in self.latencies.values() for s in values]
        out: dict[str, Any] = {
            "codes": {str(code): len(values) for code, values in sorted(self.latencies.items())},
            "transport_errors": self.errors, "seconds": round(wall_s, 3), "ok": len(ok),
            "throughput_rps": round(len(ok) / wall_s, 2) if wall_s > 0 else 0.0, **pct(ok),
            "refused": {f"refused_{k}": v for k, v in pct(refused).items()},
            "all": {f"all_{k}": v for k, v in pct(every).items()},
        }
        out.update(out.pop("refused"))
        out.update(out.pop("all"))
        if self.send_delays:
            out["generator_lag_p99_ms"] = round(float(np.percentile(np.asarray(self.send_delays) * 1000, 99)), 2)
        return out


class Pool:
    """Idle keep-alive connections; a request with none idle opens a new one (up to ``limit``).

    Like any HTTP client it does not reuse a connection the server may have closed: one idle longer than
    ``keepalive_expiry_s`` (below uvicorn's 5 s keep-alive timeout) or one whose server already sent EOF is
    dropped, so a keep-alive close racing a new request is not reported as a transport error."""

    def __init__(self, url: str, limit: int, keepalive_expiry_s: float = 4.0) -> None:
        self.url = url
        self.idle: deque[tuple[Connection, float]] = deque()  # (connection, idle since), most recent last
        self.slots = asyncio.Semaphore(limit)
        self.keepalive_expiry_s = keepalive_expiry_s

    async def take(self) -> Connection:
        await self.slots.acquire()
        expired_before = time.perf_counter() - self.keepalive_expiry_s
        while self.idle:
            conn, since = self.idle.pop()
            if since > expired_before and not conn.reader.at_eof():
                return conn
            conn.close()
        try:
            return await Connection.connect(self.url)
        except BaseException:
            self.slots.release()
            raise

    def give(self, conn: Connection) -> None:
        if conn.open:
            self.idle.append((conn, time.perf_counter()))
        else:
            conn.close()
        self.slots.release()

    def close(self) -> None:
        while self.idle:
            self.idle.pop()[0].close()


async def _one(pool: Pool, raw: bytes, scheduled: float, tally: Tally, timeout_s: float) -> None:
    try:
        conn = await pool.take()
    except OSError:
        tally.errors += 1
        return
    tally.send_delays.append(time.perf_counter() - scheduled)
    try:
        status = await asyncio.wait_for(conn.request(raw), timeout_s)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
        conn.open = False
        tally.errors += 1
    else:
        tally.add(status, time.perf_counter() - scheduled)
    pool.give(conn)


async def open_loop(url: str, raw: bytes, rate: float, seconds: float, max_connections: int = 512,
                    timeout_s: float = 30.0, seed: int = 0) -> dict[str, Any]:
    """Poisson arrivals at ``rate`` per second for ``seconds``; latency counted from each scheduled arrival."""
    rng = random.Random(seed)
    tally = Tally()
    pool = Pool(url, max_connections)
    tasks: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    next_at = start
    try:
        while True:
            next_at += rng.expovariate(rate)
            if next_at - start > seconds:
                break
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.get_running_loop().create_task(_one(pool, raw, next_at, tally, timeout_s))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)
        wall = time.perf_counter() - start
    finally:
        for task in tasks:
            task.cancel()
        pool.close()
    result = tally.summary(wall)
    result.update({"offered_rps": rate, "arrivals": sum(len(v) for v in tally.latencies.values()) + tally.errors})
    return result


async def closed_loop(url: str, raw: bytes, clients: int, max_requests: int, seconds: float,
                      timeout_s: float = 120.0) -> dict[str, Any]:
    """``clients`` connections, each sending its next request as soon as the last one is answered."""
    tally = Tally()
    issued = 0
    stop_at = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal issued
        conn: Connection | None = None
        try:
            while issued < max_requests and time.perf_counter() < stop_at:
                issued += 1
                if conn is None or not conn.open:
                    conn = await Connection.connect(url)
                sent = time.perf_counter()
                try:
                    status = await asyncio.wait_for(conn.request(raw), timeout_s)
                except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
                    tally.errors += 1
                    conn.close()
                    conn = None
                    continue
                tally.add(status, time.perf_counter() - sent)
        finally:
            if conn is not None:
                conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    result = tally.summary(time.perf_counter() - start)
    result["concurrency"] = clients
    return result
