"""docker/local/: the stand-ins of the official images that `make compose-test` builds where no image registry is
reachable. Their PostgreSQL entrypoint runs natively here, against Debian's PostgreSQL as in the image; the images
themselves run in `make compose-test` (docs/compose-stack.md)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.deploy.conftest import DOCKER, free_port
from tests.service.pg_cluster import postgres_bindir
from tests.waiting import wait_for

ENTRYPOINT = DOCKER / "local" / "postgres-entrypoint.sh"
PASSWORD = "a-long-random-password"


@pytest.fixture
def cluster_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="pg-ep-"))  # short: the socket's path has ~100 characters
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def start(root: Path, port: int) -> subprocess.Popen[str]:
    """The entrypoint as the image runs it (user postgres, PATH with the server's binaries, the official image's
    variables), its socket in ``root`` and TCP on loopback only."""
    env = {"PATH": f"{postgres_bindir()}:/usr/bin:/bin", "PGDATA": str(root / "data"), "PGPORT": str(port),
           "PGHOST": str(root), "POSTGRES_USER": "director", "POSTGRES_PASSWORD": PASSWORD, "POSTGRES_DB": "director"}
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.Popen([*as_owner, "env", "-i", *(f"{k}={v}" for k, v in env.items()), str(ENTRYPOINT),
                             "-c", f"unix_socket_directories={root}", "-c", "listen_addresses=127.0.0.1",
                             "-c", "fsync=off"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def connect(port: int, password: str) -> psycopg.Connection:
    connections: list[psycopg.Connection] = []

    def connected() -> bool:
        try:
            connections.append(psycopg.connect(host="127.0.0.1", port=port, user="director", password=password,
                                               dbname="director", connect_timeout=5, autocommit=True))
        except psycopg.OperationalError as error:
            if "password authentication failed" in str(error):
                raise
            return False
        return True

    wait_for(connected, "the server to take connections", poll_s=0.1)
    return connections[-1]


def stop(proc: subprocess.Popen[str]) -> str:
    os.killpg(proc.pid, signal.SIGINT)  # the image's STOPSIGNAL (a fast shutdown), past runuser to the server
    out, _ = proc.communicate(timeout=60)
    return out


def test_postgres_entrypoint_initialises_once_with_the_official_variables(cluster_root: Path) -> None:
    port = free_port()
    first = start(cluster_root, port)
    try:
        with connect(port, PASSWORD) as conn:
            conn.execute("CREATE TABLE kept (n int)")
            conn.execute("INSERT INTO kept VALUES (7)")
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            connect(port, "wrong")
    finally:
        log = stop(first)
    assert "initialised" in log and first.returncode == 0, log
    second = start(cluster_root, port)  # the volume kept: no second initialisation
    try:
        with connect(port, PASSWORD) as conn:
            assert conn.execute("SELECT n FROM kept").fetchone() == (7,)
    finally:
        log = stop(second)
    assert "initialised" not in log, log
