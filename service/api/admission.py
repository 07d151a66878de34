"""Admission control before the body is read: an overloaded model refuses a prediction with 503 at once.

Why: a request refused only at ``enqueue`` has already had its body received, parsed as JSON, validated and
converted to pixels. Under a flood that work is spent on every refused request and the loop saturates, so
refusals queue behind each other (docs/benchmarks.md: refused p99 5.4 s). Here a prediction request whose
model version has no free queue slot when it arrives gets the 503 + ``Retry-After`` JSON error straight away,
without its body being read (uvicorn discards the rest of the body and keeps the connection), so a refusal
costs about as much as parsing its headers.

An admitted request reserves its slot (a ``Ticket``) only once its body has arrived in full, and keeps it while
the body is parsed and decoded, until it is queued (or released if it ends before). Reserving at arrival would
let clients that announce a body and never send it (or trickle it) hold every slot: 256 stalled uploads would
make every other prediction 503 until they time out (``DIRECTOR_BODY_TIMEOUT_S`` answers those with 408). The
price: a request admitted on its headers may still find the queue full once its body is in, and then gets the
same 503 from the route. A slot not turned into a queued request within ``request_timeout_s`` lapses; such a
late request is then queued only if there is room.

Which queue a request targets:

- ``POST /v2/models/{m}[/versions/{v}]/infer``: the path names it; that version's queue decides.
- ``POST /predict`` and ``/predict/image``: the model is in the body, not read yet. The request is admitted on
  (and reserves its slot on) the default model's default version (the target of every request that names no
  model). When that queue is full it is refused only if every ready version's queue is full too, since it might
  name another model; otherwise it goes on without a ticket and its own target's queue decides once the body
  is parsed (``serving.queue_slot``: the same 503, after the body but before any decoding). A ticket on a model
  the body does not name is released as soon as the request is queued elsewhere. So a one-model server (the
  usual deployment) refuses every excess prediction early; a client of a several-model server that wants that
  for a non-default model uses the OIP route, which carries the model in its path.

Everything else passes through untouched: unknown models, versions that are loading or unavailable, a
draining server (the routes answer those). A request without the API key never gets here: ``service.api.auth`` in
front of this middleware answers it 401 (never a 503 that would tell an unauthenticated client about the load)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.middleware import ENDPOINT_KEY
from service.engine.batching import BatchWorker, Ticket
from service.engine.repository import ModelVersion, VersionState
from service.errors import error_response
from service.observability.metrics import QUEUE_FULL
from service.state import AppState

TICKET_KEY = "director.ticket"
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Target:
    endpoint: str  # route template, the metrics label
    model: str | None  # None: named in the body
    version: str | None


def match(method: str, path: str) -> Target | None:
    """The prediction route ``path`` belongs to, without running the router (a few string comparisons)."""
    if method != "POST":
        return None
    if path in ("/predict", "/predict/image"):
        return Target(path, None, None)
    parts = path.split("/")
    if len(parts) == 5 and parts[:3] == ["", "v2", "models"] and parts[4] == "infer" and parts[3]:
        return Target("/v2/models/{name}/infer", parts[3], None)
    if (len(parts) == 7 and parts[:3] == ["", "v2", "models"] and parts[4] == "versions" and parts[6] == "infer"
            and parts[3] and parts[5]):
        return Target("/v2/models/{name}/versions/{version}/infer", parts[3], parts[5])
    return None


def ticket_of(scope: Scope) -> Ticket | None:
    """The slot reserved for this request by ``Admission``, if any."""
    return scope.get(TICKET_KEY)


def _worker(entry: ModelVersion | None) -> BatchWorker | None:
    if entry is None or entry.state is not VersionState.READY or entry.worker is None or entry.worker.closed:
        return None
    return entry.worker


@dataclass(frozen=True)
class Refusal:
    entry: ModelVersion
    max_queue: int


def decide(state: AppState, target: Target) -> BatchWorker | Refusal | None:
    """The worker whose queue admitted the request (a slot is reserved there once the body is in), a refusal, or
    None (no early decision: the route decides)."""
    repo = state.repository
    if target.model is not None:  # OIP: the path names the version
        entry = repo.get(target.model, target.version) if repo.is_known(target.model) else None
        worker = _worker(entry)
        if entry is None or worker is None:
            return None
        return worker if worker.pending < worker.max_queue else Refusal(entry, worker.max_queue)
    default = repo.default_version(state.settings.default_model) if repo.is_known(state.settings.default_model) \
        else None
    worker = _worker(default)
    if worker is not None and worker.pending < worker.max_queue:
        return worker
    ready = [(entry, w) for entry in repo.all_versions() if (w := _worker(entry)) is not None]
    if not ready or any(w.pending < w.max_queue for _, w in ready):
        return None  # the body may name a model with room (or nothing is ready: the route explains)
    entry, w = next(((e, w) for e, w in ready if e is default), ready[0])
    return Refusal(entry, w.max_queue)


class Admission:
    """Pure ASGI middleware in front of the router; ``get_state`` returns None until the lifespan built it."""

    def __init__(self, app: ASGIApp, get_state: Callable[[], AppState | None]) -> None:
        self.app = app
        self.get_state = get_state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = match(scope["method"], scope["path"]) if scope["type"] == "http" else None
        state = self.get_state() if target is not None else None
        if target is None or state is None:
            await self.app(scope, receive, send)
            return
        decision = decide(state, target)
        if isinstance(decision, Refusal):
            entry = decision.entry
            state.metrics.rejected.labels(entry.name, entry.version, QUEUE_FULL).inc()
            scope[ENDPOINT_KEY] = target.endpoint
            response = error_response(
                503, f"model {entry.name!r} is overloaded: queue full ({decision.max_queue} requests queued or "
                     "being prepared)", headers={"Retry-After": str(RETRY_AFTER_S)})
            await response(scope, receive, send)  # the body is never read; uvicorn discards it
            return
        if decision is None:
            await self.app(scope, receive, send)
            return
        worker = decision

        async def reserving_receive() -> Message:
            msg = await receive()
            if msg["type"] == "http.request" and not msg.get("more_body", False) and TICKET_KEY not in scope:
                ticket = worker.reserve()  # None when the queue filled meanwhile: the route refuses at enqueue
                if ticket is not None:
                    scope[TICKET_KEY] = ticket
            return msg

        try:
            await self.app(scope, reserving_receive, send)
        finally:
            ticket = ticket_of(scope)
            if ticket is not None:
                ticket.release()  # no-op once the request was queued
