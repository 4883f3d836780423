"""Running the collector: uvicorn (uvloop + httptools), one process or `server.workers` of them.

The serving process holds the incoming directory's server lock, rotates what a previous run
left in live files, then serves. SIGTERM or SIGINT shut down gracefully: in-flight requests
finish, then every written log is rotated. Worker processes are forked from the serving process
and share its listening socket and lock; worker n writes `incoming.tok=<id>|w=<n>.log`.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import socket
from pathlib import Path
from types import FrameType
from typing import Protocol

import uvicorn

from eventspark.collector.app import CollectorApp
from eventspark.config import LoadedConfig
from eventspark.config.models import Config
from eventspark.config.sources import publish, published_raw
from eventspark.logs.incoming import ServerLock, ServerLockHeld, rotate_live_files

logger = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_SECONDS = 30
PR_SET_PDEATHSIG = 1  # <sys/prctl.h>
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class Background(Protocol):
    """Services that run beside the collector in the serving process (`eventspark.node`)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def instances(self) -> list[str]: ...


def run_server(loaded: LoadedConfig, background: Background | None = None) -> None:
    """Serves until SIGTERM/SIGINT; exits with status 1 when another server holds the directory.

    `background` starts once the collector's worker processes are forked and stops after the
    collector has flushed and rotated its logs.
    """
    config = loaded.config
    incoming = Path(config.log.path) / "incoming"
    lock = ServerLock(incoming)
    try:
        lock.acquire()
    except ServerLockHeld as exc:
        logger.error("%s; stop it or use another log.path", exc)
        raise SystemExit(1) from None
    try:
        leftovers = rotate_live_files(incoming)
        if leftovers:
            logger.info("rotated %d incoming log(s) left by a previous run", len(leftovers))
        # Before forking: every collector process starts from this config and follows its reloads.
        publish(Path(config.log.path), published_raw(loaded))
        if config.server.workers == 1:
            _serve(config, worker=None, sock=None, background=background)
        else:
            _serve_workers(config, background)
    finally:
        lock.release()


def uvicorn_config(app: CollectorApp, config: Config) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=config.server.host,
        port=config.server.port,
        loop="uvloop",
        http="httptools",
        ws="none",
        interface="asgi3",
        lifespan="on",
        access_log=False,
        log_config=None,  # logging is set up by the CLI
        proxy_headers=False,  # X-Real-IP / X-Forwarded-For are read by ContextEnrichment itself
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )


def _serve(
    config: Config, worker: int | None, sock: socket.socket | None, background: Background | None = None
) -> None:
    app = CollectorApp(config, worker, instances=background.instances if background is not None else None)
    server = uvicorn.Server(uvicorn_config(app, config))
    # uvicorn re-raises the signal that stopped it once it has shut down; with the default
    # SIGTERM action that would kill the process before the `finally` below.
    previous = signal.signal(signal.SIGTERM, _exit_quietly)
    if background is not None:
        background.start()
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        app.close()  # a no-op after a graceful shutdown; rotates after a forced one
        if background is not None:
            background.stop()
        signal.signal(signal.SIGTERM, previous)


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _serve_workers(config: Config, background: Background | None) -> None:
    # Bound once here with uvicorn's own settings; the app passed is never served.
    sock = uvicorn_config(CollectorApp(config), config).bind_socket()
    # fork: workers inherit the socket and the server lock; nothing runs threads yet.
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(
            target=_worker_main, args=(config, n, sock, background, os.getpid()), name=f"eventspark-worker-{n}"
        )
        for n in range(config.server.workers)
    ]

    def forward(signum: int, frame: FrameType | None) -> None:
        for process in workers:
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signum)

    # Workers answer /ping as soon as they are forked: a SIGTERM from then on must be forwarded,
    # not kill this process (default action). Blocked until `forward` is installed, it waits; the
    # workers are forked with it blocked too and unblock it once their own handler is in place.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        for process in workers:
            process.start()
        previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # before any thread is started
    logger.info("started %d collector workers on port %d", len(workers), config.server.port)
    if background is not None:
        background.start()
    try:
        for process in workers:
            process.join()
    finally:
        if background is not None:
            background.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    failed = [p.name for p in workers if p.exitcode not in (0, -signal.SIGTERM, -signal.SIGINT)]
    if failed:
        logger.error("collector worker(s) %s ended abnormally", ", ".join(failed))
        raise SystemExit(1)


def _worker_main(config: Config, worker: int, sock: socket.socket, background: Background | None, parent: int) -> None:
    # The terminal's Ctrl-C reaches every worker directly; the parent forwards SIGTERM.
    # Workers answer /api/v1/cluster from the coordination store but run no background service.
    # Forked with SIGTERM and SIGINT blocked (`_serve_workers`); one that came since is raised here.
    signal.signal(signal.SIGTERM, _exit_quietly)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    _stop_with_parent(parent)
    instances = _InstancesOnly(background) if background is not None else None
    _serve(config, worker, sock, instances)


def _stop_with_parent(parent: int) -> None:
    """Asks Linux for a SIGTERM when the serving process dies (kill -9 included): a worker left
    alone would keep taking events on the shared port with no uploader nor stream worker behind it.
    It then shuts down gracefully, rotating what it wrote."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the parent's forwarding is all there is
        return
    if os.getppid() != parent:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


class _InstancesOnly:
    """A worker's view of the parent's background services: it may read the cluster, not run it."""

    def __init__(self, background: Background) -> None:
        self._background = background

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def instances(self) -> list[str]:
        return self._background.instances()
