"""A throw-away PostgreSQL for the tests that stop or kill a server: `initdb` in a temporary
folder, its own port on 127.0.0.1 and its own socket directory. The machine's server on
127.0.0.1:5432 is shared with everyone else on the machine and must stay up.

PostgreSQL refuses to run as root: as root, `initdb`, `pg_ctl` and the server run as the
`postgres` user (through `runuser`), in a folder under /tmp that user owns.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

SERVER_USER = "postgres"
"""The user the server runs as when the tests run as root (Debian's postgresql package makes it)."""
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    # Only an OS crash loses unsynced writes; a killed server keeps them (they are in the page
    # cache). Skipping fsync keeps a server that the tests stop and start quick.
    "fsync": "off",
    "shared_buffers": "32MB",
    "max_connections": "50",
}


class PostgresError(RuntimeError):
    """`initdb` or `pg_ctl` failed; the message holds its output and the end of the server's log."""


def find_bindir() -> Path:
    """The folder holding `initdb`, `pg_ctl` and `postgres`: `pg_config --bindir`, else the newest
    /usr/lib/postgresql/<version>/bin. Fails the test (not a skip) when there is none."""
    candidates: list[Path] = []
    if pg_config := shutil.which("pg_config"):
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if found.returncode == 0:
            candidates.append(Path(found.stdout.strip()))
    versioned = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if Path(p).parent.name.isdigit()]
    candidates += sorted(versioned, key=lambda p: int(p.parent.name), reverse=True)
    for bindir in candidates:
        if all((bindir / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return bindir
    pytest.fail(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in `pg_config --bindir` or "
        "/usr/lib/postgresql/*/bin: apt-get install -y postgresql",
        pytrace=False,
    )


def _run_as() -> list[str]:
    """The prefix that runs a command as the server's user: nothing unless we are root."""
    if os.geteuid() != 0:
        return []
    try:
        subprocess.run(["id", "-u", SERVER_USER], capture_output=True, check=True)
    except subprocess.CalledProcessError:
        pytest.fail(f"running as root, and there is no `{SERVER_USER}` user to run PostgreSQL as", pytrace=False)
    return ["runuser", "-u", SERVER_USER, "--"]


def process_alive(pid: int) -> bool:
    """False once the process is gone or a zombie (dead, not yet reaped by whoever adopted it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (the server's backends and helpers)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == pid:
            children.append(int(stat.parent.name))
    return children


@dataclass
class PostgresServer:
    """A private server with its data in `folder/data`, on 127.0.0.1:`port` (user postgres, trust)."""

    folder: Path
    port: int
    bindir: Path
    run_as: list[str]

    @classmethod
    def initialise(cls, port: int) -> PostgresServer:
        """`initdb` in a new temporary folder (owned by the server's user); does not start it."""
        bindir, run_as = find_bindir(), _run_as()
        folder = Path(tempfile.mkdtemp(prefix="eventspark-pg-"))
        if run_as:
            shutil.chown(folder, SERVER_USER, SERVER_USER)
        server = cls(folder, port, bindir, run_as)
        try:
            # --no-sync: a test server need not survive an OS crash.
            options = ["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"]
            server._command("initdb", "-D", str(server.data), *options)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return server

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def conninfo(self, dbname: str = "test") -> str:
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user=postgres"

    def datasource(self, schema: str, db: str = "test") -> dict[str, Any]:
        """The `datasource` section of a postgres destination writing into `schema` of `db`."""
        return {"host": "127.0.0.1", "port": self.port, "db": db, "schema": schema, "username": "postgres"}

    def start(self) -> None:
        """Returns once the server accepts connections."""
        options = " ".join([f"-p {self.port}", f"-k {self.folder}", *(f"-c {k}={v}" for k, v in SETTINGS.items())])
        log = str(self.folder / "server.log")
        self._command("pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """`pg_ctl stop -m mode` (smart, fast or immediate); returns once the server is gone."""
        self._command("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def kill(self, timeout: float = 30) -> None:
        """SIGKILL of the server and its backends, as a crash; returns once they are all gone."""
        pid = self.pid()
        if pid is None:
            return
        # Each backend runs in a session of its own, so a process group does not reach them all.
        processes = [pid, *_children(pid)]
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while any(process_alive(process) for process in processes):
            assert time.monotonic() < deadline, f"PostgreSQL ({pid}) survived SIGKILL for {timeout} s"
            time.sleep(0.05)
        # A server refuses to start while its lock files name a pid that exists, and the killed
        # server stays a zombie until whoever adopted it reaps it (here up to 2 s): with none of
        # its processes running the files are stale, as after a crash, and may go.
        (self.data / "postmaster.pid").unlink(missing_ok=True)
        (self.folder / f".s.PGSQL.{self.port}.lock").unlink(missing_ok=True)

    def pid(self) -> int | None:
        """The server's pid while it runs (the first line of postmaster.pid), else None."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None
        return pid if process_alive(pid) else None

    def is_up(self) -> bool:
        try:
            psycopg.connect(self.conninfo("postgres"), connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    def create_database(self, name: str) -> None:
        with psycopg.connect(self.conninfo("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def destroy(self) -> None:
        """Stops the server whatever state it is in and deletes its folder."""
        if self.pid() is not None:
            try:
                self.stop("immediate")
            except PostgresError:
                self.kill()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _command(self, program: str, *args: str) -> None:
        """Runs one of the server's programs as its user; a failure raises with the program's output."""
        command = [*self.run_as, str(self.bindir / program), *args]
        # cwd: the server's user may not be allowed into the directory pytest runs in.
        done = subprocess.run(command, cwd=self.folder, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            log = self.folder / "server.log"
            tail = "".join(f"server.log: {x}\n" for x in log.read_text().splitlines()[-20:]) if log.exists() else ""
            raise PostgresError(f"{' '.join(command)} exited with {done.returncode}:\n{done.stdout}{done.stderr}{tail}")
