"""``python -m service``: one server process, or a supervisor of several (``DIRECTOR_WORKERS``)."""

from __future__ import annotations

import logging
import os
import tempfile

from uvicorn.config import STARTUP_FAILURE

from service.config import Settings
from service.server import configure_logging, serve_on, uvicorn_config
from service.supervisor import Supervisor

log = logging.getLogger("service.launch")


def serve(settings: Settings) -> int:
    """Serve until SIGTERM; the exit status. With several workers a supervisor runs ``serve_on`` in each."""
    configure_logging(settings)
    if settings.workers == 1:
        return 0 if serve_on(settings) else STARTUP_FAILURE
    # several processes: metrics go through prometheus-client's multiprocess mode; the variable has to be set
    # before prometheus_client is imported in the workers (they inherit this environment)
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="director-prometheus-")
        log.info("PROMETHEUS_MULTIPROC_DIR=%s", os.environ["PROMETHEUS_MULTIPROC_DIR"])
    sock = uvicorn_config(None, settings).bind_socket()
    try:
        return Supervisor(settings, sock).run()
    finally:
        sock.close()
