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
  is parsed (``service.engine.predictor.Predictor.queue_slot``: the same 503, after the body but before any
  decoding). A ticket on a model the body does not name is released as soon as the request is queued elsewhere.
  So a one-model server (the usual deployment) refuses every excess prediction early; a client of a several-model
  server that wants that for a non-default model uses the OIP route, which carries the model in its path.

Everything else passes through untouched: unknown models, versions that are loading or unavailable, a
draining server (the routes answer those). The gateway (``service.api.gateway``) asks here (``match``, ``decide``)
once a request's key and announced size have passed, so a request without the API key is answered 401, never a
503 that would tell an unauthenticated client about the load."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.responses import Response
from starlette.types import Scope

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
    """The slot reserved for this request at admission (by the gateway, once its body was in), if any."""
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
    named = target.model is not None  # OIP: the path names the version
    name = target.model if target.model is not None else state.settings.default_model
    entry = None
    if repo.is_known(name):
        entry = repo.get(name, target.version) if named else repo.default_version(name)
    worker = entry.worker if entry is not None and entry.state is VersionState.READY else None
    if entry is None or worker is None or worker.closed:
        return None if named else _when_every_version_is_full(state, entry)
    capacity = worker.max_queue
    if worker.pending < capacity:
        return worker
    return Refusal(entry, capacity) if named else _when_every_version_is_full(state, entry)


def _when_every_version_is_full(state: AppState, default: ModelVersion | None) -> Refusal | None:
    """A request naming its model in the body is refused early only when every ready version's queue is full (the
    default version's refusal, if it is one of them); otherwise it may name a model with room (or nothing is ready,
    and the route explains)."""
    ready = [(entry, w) for entry in state.repository.all_versions() if (w := _worker(entry)) is not None]
    if not ready or any(w.pending < w.max_queue for _, w in ready):
        return None
    entry, w = next(((e, w) for e, w in ready if e is default), ready[0])
    return Refusal(entry, w.max_queue)


def refusal_response(state: AppState, refusal: Refusal) -> Response:
    """The 503 (``Retry-After``) of a refused request, counted as a queue-full rejection of the version."""
    entry = refusal.entry
    state.metrics.rejected.labels(entry.name, entry.version, QUEUE_FULL).inc()
    return error_response(503, f"model {entry.name!r} is overloaded: queue full ({refusal.max_queue} requests queued "
                               "or being prepared)", headers={"Retry-After": str(RETRY_AFTER_S)})
