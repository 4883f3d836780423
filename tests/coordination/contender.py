"""A separate process contending for a lock, started by the cross-process tests.

    python contender.py '<json spec>'

Spec: backend (kind, config, key_prefix, lease_seconds), node, lock, and a mode:
- "count": `rounds` times, under the lock, read-sleep-write the integer in file `counter`; an
  exclusive marker file next to it detects two processes inside the lock at once (exit 3).
- "hold": take the lock, print "locked", hold it for `hold_seconds`, print "released".
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from eventspark.config.models import EtcdConfig, RedisConfig
from eventspark.coordination import Coordination

OVERLAP_EXIT_CODE = 3


def open_coordination(backend: dict[str, Any], node: str, heartbeat_ttl: float = 30.0) -> Coordination:
    """The coordination described by a JSON-able backend spec (also used by the test fixtures)."""
    options = {
        "lease_seconds": backend["lease_seconds"],
        "heartbeat_ttl": heartbeat_ttl,
        "key_prefix": backend["key_prefix"],
    }
    if backend["kind"] == "redis":
        from eventspark.coordination.redis import RedisCoordination

        return RedisCoordination(RedisConfig(**backend["config"]), node, **options)
    from eventspark.coordination.etcd import EtcdCoordination

    return EtcdCoordination(EtcdConfig(**backend["config"]), node, **options)


def count(coordination: Coordination, lock: str, counter: Path, rounds: int) -> int:
    marker = counter.with_name(counter.name + ".inside")
    for _ in range(rounds):
        with coordination.lock(lock, timeout=20):
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                print("overlap: another process is inside the lock", flush=True)
                return OVERLAP_EXIT_CODE
            value = int(counter.read_text() or "0")
            time.sleep(0.005)  # widens the window in which an unprotected update would be lost
            counter.write_text(str(value + 1))
            os.close(fd)
            marker.unlink()
    return 0


def hold(coordination: Coordination, lock: str, seconds: float) -> int:
    with coordination.lock(lock, timeout=20):
        print("locked", flush=True)
        time.sleep(seconds)
    print("released", flush=True)
    return 0


def main(spec: dict[str, Any]) -> int:
    coordination = open_coordination(spec["backend"], spec["node"])
    try:
        if spec["mode"] == "count":
            return count(coordination, spec["lock"], Path(spec["counter"]), spec["rounds"])
        return hold(coordination, spec["lock"], spec["hold_seconds"])
    finally:
        coordination.close()


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
