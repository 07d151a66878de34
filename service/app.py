"""The FastAPI application: state built in the lifespan, routers included, errors registered in one place."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import torch
from fastapi import FastAPI

from service import __doc__ as package_doc
from service import __version__
from service.api.auth import OPEN_PATHS, docs_paths
from service.api.cors import Cors
from service.api.gateway import Gateway
from service.api.grpc_thread import serve_grpc
from service.api.routes import feedback, health, metrics, models, oip, predict, repository
from service.config import Settings
from service.engine.artifact import Artifact
from service.engine.batching import BatchStats, BatchWorker
from service.engine.decoding import DecodePool
from service.engine.device import resolve_device
from service.engine.model_settings import ModelConfigFile, ServingSettings, serving_settings
from service.engine.predictor import Predictor
from service.engine.repository import ModelRepository, Only
from service.errors import register_error_handlers
from service.feedback.calls import StoreCalls
from service.feedback.configured import open_feedback_store
from service.feedback.flusher import LogFlusher
from service.feedback.live_refresh import LiveRefresher
from service.observability.exposition import Exposition
from service.observability.metrics import Metrics
from service.observability.multiprocess import mark_process_dead
from service.observability.statistics import Statistics
from service.observability.tracing import Tracing
from service.state import AppState, Lifecycle

log = logging.getLogger("service")


def build_state(settings: Settings, metrics_: Metrics, lifecycle: Lifecycle, tracing: Tracing | None = None
                ) -> AppState:
    device = resolve_device(settings.device, settings.bf16, settings.torch_threads, settings.max_batch_samples,
                            settings.max_batch_tokens, settings.shape_buckets, settings.concurrent_forwards)
    device.on_out_of_memory = metrics_.gpu_out_of_memory.inc
    cuda = device.is_cuda  # device memory is CUDA's only: off it a batch has none to observe
    holder: dict[str, AppState] = {}

    def make_worker(name: str, version: str, artifact: Artifact, serving: ServingSettings) -> BatchWorker:
        def on_batch(stats: BatchStats) -> None:
            labels = (name, version)
            metrics_.batch_size.labels(*labels).observe(stats.inputs)
            metrics_.batch_requests.labels(*labels).observe(stats.requests)
            metrics_.batch_samples.labels(*labels).observe(stats.rows)
            if stats.tokens is not None:
                metrics_.batch_tokens.labels(*labels).observe(stats.tokens)
            metrics_.inference.labels(*labels).observe(stats.inference_s)
            for wait in stats.queue_waits:
                metrics_.queue_wait.labels(*labels).observe(wait)
            if cuda:
                metrics_.observe_device_memory(device.memory_stats())
            holder["state"].statistics.of(*labels).forward(stats.inputs, stats.requests, stats.inference_s,
                                                           stats.queue_waits)

        return BatchWorker(artifact, device, serving.max_batch_samples, serving.max_batch_delay_ms, serving.max_queue,
                           on_batch, reservation_timeout_s=serving.request_timeout_s,
                           max_batch_tokens=serving.max_batch_tokens, instances=serving.instances,
                           request_timeout_s=serving.request_timeout_s)

    def settings_of(config: ModelConfigFile | None) -> ServingSettings:
        return serving_settings(config, device.shapes, settings.max_batch_delay_ms, settings.max_queue,
                                settings.request_timeout_s)

    repository = ModelRepository(settings.model_repository, device, make_worker, settings_of,
                                 drain_timeout_s=settings.request_timeout_s,
                                 on_change=lambda: holder["state"].sync_version_metrics(),
                                 trusted_digests=settings.trusted_digests)
    metrics_.live.min_clients.set(settings.alert_min_clients)
    store = open_feedback_store(settings)
    store.on_drop = metrics_.prediction_log_dropped.inc
    decoder = DecodePool(settings.decode_threads)
    statistics = Statistics()
    predictor = Predictor(settings, repository, decoder, metrics_, statistics, store, tracing)
    calls = StoreCalls(settings.feedback_threads, settings.feedback_timeout_s, settings.feedback_retry_s)
    state = AppState(settings, device, metrics_, repository, store, lifecycle, decoder, calls, statistics, predictor,
                     LogFlusher(store, calls), Exposition(lambda: holder["state"].metrics_body(),
                                                          settings.metrics_max_age_s))
    holder["state"] = state
    return state


def create_app(settings: Settings | None = None, lifecycle: Lifecycle | None = None, only: Only | None = None
               ) -> FastAPI:
    """The server; with ``only``, serving that one model version and loading nothing else (the batch scorer)."""
    settings = settings or Settings()
    lifecycle = lifecycle or Lifecycle()
    metrics_ = Metrics()
    tracing = Tracing(settings.otlp_endpoint)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = build_state(settings, metrics_, lifecycle, tracing)
        app.state.director = state
        state.repository.only = only
        state.repository.start(settings.poll_interval_s, state.refresh_live_gauges)  # the gauges survive a restart
        state.flusher.start()
        refresher = LiveRefresher(state.refresh_live_gauges, settings.live_refresh_s)
        refresher.start()
        grpc_server = app.state.grpc = await serve_grpc(state, settings)  # on a thread of its own
        log.info("serving %s on %s (%d threads)", settings.model_repository, state.device.torch_device,
                 torch.get_num_threads())
        try:
            yield
        finally:
            lifecycle.draining = True
            if grpc_server is not None:  # no new calls; the ones in progress get the request timeout to finish
                await grpc_server.stop(settings.request_timeout_s)
            await state.repository.close()  # queued requests finish first
            await asyncio.to_thread(state.decoder.close)
            await refresher.close()
            await state.flusher.close()  # writes what is still pending
            await asyncio.to_thread(tracing.shutdown)  # exports the spans still buffered
            mark_process_dead()

    app = FastAPI(title="DIRECTOR serving", version=__version__, lifespan=lifespan,
                  description=(package_doc or "") + "\n\nErrors share one JSON shape: "
                  "`{\"error\": message, \"status\": code, \"type\": kind, \"details\": [...]}`.")
    app.state.lifecycle = lifecycle
    register_error_handlers(app)
    for router in (predict.router, feedback.router, models.router, health.router, metrics.router, oip.router,
                   repository.router):
        app.include_router(router)
    docs = docs_paths(app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)
    opened = (OPEN_PATHS - ({"/metrics"} if settings.metrics_require_key else set())
              | (docs if settings.public_docs else frozenset()))
    # ids, the key, the body's bounds, admission, drain and HTTP metrics: one layer in front of the routes
    app.add_middleware(Gateway, settings=settings, metrics=metrics_, lifecycle=lifecycle, tracing=tracing,
                       app_state=app.state, open_paths=opened, templates=lambda: [*app.openapi()["paths"], *docs])
    if settings.cors_origins:  # outermost: a browser's preflight carries no key and is answered here
        app.add_middleware(Cors, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "Inference-Header-Content-Length"],
                           expose_headers=["Inference-Header-Content-Length", "Retry-After"], max_age=600)
    return app
