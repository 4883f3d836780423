"""A stand-in for `eventspark serve` in the crash tests, run as `python -m tests.stream.stream_process`.

Starts the stream workers of a config, then appends `count` events (`event(n)`) to the queue of
`dest_id` in chunks of `chunk`, printing the number of events appended after each append returned
(what the collector would have acknowledged), then idles until it is killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from eventspark.config import load_config
from eventspark.stream.manager import StreamWorkers
from eventspark.stream.queue import QueueWriter, queue_dir
from tests.stream.helpers import FAST, event, line


def main(config_path: str, dest_id: str, count: int, chunk: int, pause: float) -> None:
    loaded = load_config(config_path)
    workers = StreamWorkers(loaded, settings=FAST)
    workers.start()
    writer = QueueWriter(queue_dir(Path(loaded.config.log.path), dest_id))
    for start in range(0, count, chunk):
        numbers = range(start, min(start + chunk, count))
        writer.append(b"".join(line(event(n)) for n in numbers), len(numbers))
        sys.stdout.write(f"{numbers[-1] + 1}\n")
        sys.stdout.flush()
        time.sleep(pause)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
