"""Background prediction traffic for the stack's checks: threads sending requests back to back, each on a new
connection (so that a drain is measured on the server, not on a client's keep-alive reuse), every outcome kept."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class Outcome:
    sent: float      # time.monotonic() when the request left
    seconds: float
    status: int      # 0: no HTTP answer (connection refused, reset or closed without a response)
    version: str | None  # the answering model version
    error: str | None = None


class Traffic:
    """``clients`` threads posting ``body()`` to ``url + path`` until stopped."""

    def __init__(self, url: str, path: str, body: Callable[[], dict], headers: dict[str, str], clients: int = 2,
                 pause_s: float = 0.0, timeout_s: float = 60.0) -> None:
        self.url, self.path, self.body, self.headers = url, path, body, headers
        self.pause_s, self.timeout_s = pause_s, timeout_s
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=self.url, headers=self.headers, limits=limits, timeout=self.timeout_s) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    response = client.post(self.path, json=self.body())
                    version = response.json().get("model_version") if response.status_code == 200 else None
                    outcome = Outcome(sent, time.monotonic() - sent, response.status_code, version)
                except httpx.HTTPError as error:
                    outcome = Outcome(sent, time.monotonic() - sent, 0, None, type(error).__name__)
                with self._lock:
                    self.outcomes.append(outcome)
                if self.pause_s:
                    self._stop.wait(self.pause_s)

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout_s + 5)

    def summary(self, since: float | None = None, until: float | None = None) -> dict[str, object]:
        """Counts by status (and error), the versions that answered and the slowest request, for the requests
        sent in [since, until)."""
        with self._lock:
            chosen = [o for o in self.outcomes
                      if (since is None or o.sent >= since) and (until is None or o.sent < until)]
        return {"requests": len(chosen),
                "status": dict(Counter(str(o.status) for o in chosen)),
                "errors": dict(Counter(o.error for o in chosen if o.error)),
                "versions": dict(Counter(o.version for o in chosen if o.version)),
                "max_s": round(max((o.seconds for o in chosen), default=0.0), 3)}
