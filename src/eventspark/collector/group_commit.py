"""Group commit: fsync on a background thread, one fsync per file for every waiting request.

With `server.fsync: true` a request waits, without blocking the event loop, until the files it
wrote have been fsynced. Requests that arrive while an fsync runs share the next one, so the
cost per request falls as load rises.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence

from eventspark.collector.multiplex import LineFile

_Waiter = tuple[Sequence[LineFile], asyncio.Future[None], asyncio.AbstractEventLoop]


class GroupCommit:
    def __init__(self) -> None:
        self._pending: list[_Waiter] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="eventspark-fsync", daemon=True)
        self._thread.start()

    async def sync(self, files: Sequence[LineFile]) -> None:
        """Returns once every file in `files` was fsynced after this call; raises OSError if it failed."""
        if not files:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if self._stopping:
                raise RuntimeError("group commit is stopped")
            self._pending.append((files, future, loop))
            self._cond.notify()
        await future

    def stop(self) -> None:
        """Syncs what is pending, then ends the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                batch, self._pending = self._pending, []
                if not batch and self._stopping:
                    return
            self._commit(batch)

    def _commit(self, batch: list[_Waiter]) -> None:
        errors: dict[int, OSError] = {}
        files = {id(f): f for files, _, _ in batch for f in files}
        for key, file in files.items():
            try:
                file.fsync()
            except OSError as exc:
                errors[key] = exc
        for waited, future, loop in batch:
            error = next((errors[id(f)] for f in waited if id(f) in errors), None)
            # A closed loop (shutdown) has nobody waiting for this answer any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, error)


def _settle(future: asyncio.Future[None], error: OSError | None) -> None:
    if future.done():  # the request was cancelled (client gone) meanwhile
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
