"""Several worker processes on one listening socket, each the same server as a single process.

uvicorn's own multiprocess mode builds plain ``uvicorn.Server`` workers: no shutdown grace and none of
``service.connections``' protections. Here the parent binds the socket once, starts ``settings.workers`` processes
(``spawn``: no torch state inherited from the parent) that each run ``DirectorServer`` on it, and on SIGTERM or
SIGINT forwards SIGTERM to every worker, so each one drains through ``shutdown_grace_s`` as a single process
does, closes its own copy of the socket, then waits for them all: once the workers close theirs, new connections are
refused at once rather than queued where nobody will accept them. A worker listens only once its models are loaded
(``service.server.ListenOnceLoaded``). A worker that dies while serving is replaced; one that fails to start stops the
whole server (the next would fail the same way). A supervisor that dies takes its workers with it (SIGTERM from the
kernel, ``die_with_parent``), so no orphan keeps the port. A dead worker's metric files are marked dead for
prometheus-client's multiprocess mode, whether it exited cleanly or was killed."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from multiprocessing.process import BaseProcess
from types import FrameType

from prometheus_client import multiprocess as prom_multiprocess
from uvicorn.config import STARTUP_FAILURE

from service.config import Settings

log = logging.getLogger("service.supervisor")

POLL_S = 0.5  # how often the parent looks for dead workers


PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies


def die_with_parent(parent: int) -> None:
    """SIGTERM to this worker when the supervisor ``parent`` dies, however it dies (even SIGKILL, which it cannot
    pass on): the worker drains as on any SIGTERM, and a new server can bind the port. Linux's prctl does it at
    once; elsewhere a thread watches the parent's pid. A parent already gone by now means the same."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        watched = libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    except (OSError, AttributeError):
        watched = False
    if not watched:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(POLL_S)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def run_worker(settings: Settings, sock: socket.socket, parent: int) -> None:
    """A worker process: the app and ``DirectorServer`` built here, serving on the inherited socket until SIGTERM
    (from the supervisor, or from the kernel when the supervisor dies)."""
    from service.server import serve_on  # in the worker: the environment (PROMETHEUS_MULTIPROC_DIR) is final

    die_with_parent(parent)
    if not serve_on(settings, [sock]):
        raise SystemExit(STARTUP_FAILURE)


class Supervisor:
    def __init__(self, settings: Settings, sock: socket.socket) -> None:
        self.settings = settings
        self.sock = sock
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[BaseProcess] = []
        self.stopping = threading.Event()
        self.failed = False

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; the exit status (0, or ``STARTUP_FAILURE`` when a worker failed to start)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.workers = [self._start() for _ in range(self.settings.workers)]
            log.info("parent %d started workers %s", os.getpid(), [w.pid for w in self.workers])
            while not self.stopping.wait(POLL_S):
                self._replace_dead()
            # the workers' copies keep serving through their grace; once they close theirs, nothing holds the
            # socket and new connections are refused at once, instead of waiting in its backlog for nobody
            self.sock.close()
            for worker in self.workers:
                self._terminate(worker)
            for worker in self.workers:
                worker.join()
                self._mark_dead(worker)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        log.info("parent %d stopped", os.getpid())
        return STARTUP_FAILURE if self.failed else 0

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if self.stopping.is_set():  # a second signal: pass it on, each worker then stops without waiting
            for worker in self.workers:
                self._terminate(worker)
            return
        log.info("received %s: draining every worker", signal.Signals(sig).name)
        self.stopping.set()

    def _start(self) -> BaseProcess:
        worker = self.context.Process(target=run_worker, args=(self.settings, self.sock, os.getpid()),
                                      name="director-worker")
        worker.start()
        return worker

    def _replace_dead(self) -> None:
        for index, worker in enumerate(self.workers):
            if worker.is_alive():
                continue
            worker.join()
            self._mark_dead(worker)
            if worker.exitcode == STARTUP_FAILURE:
                log.error("worker %d failed to start: stopping", worker.pid)
                self.failed = True
                self.stopping.set()
                return
            log.warning("worker %d exited (status %s): starting another", worker.pid, worker.exitcode)
            self.workers[index] = self._start()

    @staticmethod
    def _terminate(worker: BaseProcess) -> None:
        if worker.pid is not None and worker.exitcode is None:
            with contextlib.suppress(ProcessLookupError):  # it exited since the check
                os.kill(worker.pid, signal.SIGTERM)

    @staticmethod
    def _mark_dead(worker: BaseProcess) -> None:
        # prometheus-client directly, not service.observability.metrics: the parent stays without torch
        if worker.pid is not None and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            prom_multiprocess.mark_process_dead(worker.pid)
