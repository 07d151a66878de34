"""A throwaway PostgreSQL cluster for the tests: Debian's ``postgresql`` package, ``initdb`` + ``pg_ctl`` in a temp
folder, reachable only on a unix socket in that folder (no TCP port to collide with or expose).

PostgreSQL refuses to run as root, so as root the cluster runs as the package's ``postgres`` user, which owns the
folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql

DEBIAN_BINARIES = "/usr/lib/postgresql/*/bin"  # Debian keeps initdb and pg_ctl off PATH


def postgres_bindir() -> Path:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/").glob(DEBIAN_BINARIES.lstrip("/")), key=lambda p: int(p.parent.name))
    assert versions, "PostgreSQL is not installed (Debian package postgresql; make test installs it)"
    return versions[-1]


class PostgresCluster:
    def __init__(self) -> None:
        self.bindir = postgres_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="director-pg-"))  # short: a socket path has ~100 characters
        self.data = self.root / "data"
        self._as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as_owner:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        result = subprocess.run([*self._as_owner, str(self.bindir / tool), *args], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, f"{tool} failed:\n{result.stdout}\n{result.stderr}"

    def start(self) -> None:
        options = f"-c listen_addresses='' -c unix_socket_directories='{self.root}' -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", options, "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.root}"

    def create_database(self, name: str) -> str:
        """A fresh database; returns its URL."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
