"""Running the collector: uvicorn (uvloop + httptools), one process or `server.workers` of them.

The serving process holds the incoming directory's server lock, rotates what a previous run
left in live files, then serves. SIGTERM or SIGINT shut down gracefully: in-flight requests
finish, then every written log is rotated. Worker processes are forked from the serving process
and share its listening socket and lock; worker n writes `incoming.tok=<id>|w=<n>.log`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
from pathlib import Path
from types import FrameType

import uvicorn

from eventspark.collector.app import CollectorApp
from eventspark.config import LoadedConfig
from eventspark.config.models import Config
from eventspark.logs.incoming import ServerLock, ServerLockHeld, rotate_live_files

logger = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_SECONDS = 30


def run_server(loaded: LoadedConfig) -> None:
    """Serves until SIGTERM/SIGINT; exits with status 1 when another server holds the directory."""
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
        if config.server.workers == 1:
            _serve(config, worker=None, sock=None)
        else:
            _serve_workers(config)
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


def _serve(config: Config, worker: int | None, sock: socket.socket | None) -> None:
    app = CollectorApp(config, worker)
    server = uvicorn.Server(uvicorn_config(app, config))
    # uvicorn re-raises the signal that stopped it once it has shut down; with the default
    # SIGTERM action that would kill the process before the `finally` below.
    previous = signal.signal(signal.SIGTERM, _exit_quietly)
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        app.close()  # a no-op after a graceful shutdown; rotates after a forced one
        signal.signal(signal.SIGTERM, previous)


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _serve_workers(config: Config) -> None:
    # Bound once here with uvicorn's own settings; the app passed is never served.
    sock = uvicorn_config(CollectorApp(config), config).bind_socket()
    # fork: workers inherit the socket and the server lock; nothing runs threads yet.
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_worker_main, args=(config, n, sock), name=f"eventspark-worker-{n}")
        for n in range(config.server.workers)
    ]
    for process in workers:
        process.start()
    logger.info("started %d collector workers on port %d", len(workers), config.server.port)

    def forward(signum: int, frame: FrameType | None) -> None:
        for process in workers:
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for process in workers:
            process.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    failed = [p.name for p in workers if p.exitcode not in (0, -signal.SIGTERM, -signal.SIGINT)]
    if failed:
        logger.error("collector worker(s) %s ended abnormally", ", ".join(failed))
        raise SystemExit(1)


def _worker_main(config: Config, worker: int, sock: socket.socket) -> None:
    # The terminal's Ctrl-C reaches every worker directly; the parent forwards SIGTERM.
    _serve(config, worker, sock)
