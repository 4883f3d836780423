"""A Spark application for the cluster tests, run as a subprocess (`python -m tests.cluster.app`):
starts the process's session with `eventspark.batch.session.get_session` (so the cluster defaults
apply), runs one job, prints one JSON line, then optionally stays alive and idle with its session.

    python -m tests.cluster.app spark://127.0.0.1:PORT [--partitions 8] [--task-sec 0.5]
        [--conf key=value ...] [--hold SECONDS]

The JSON line: `executors` (the executor id of each task: standalone executors run in
<work-dir>/<app-id>/<executor-id>, and their Python workers inherit that directory), `app_id`,
`session_sec` and `job_sec`. With `--hold`, "idle" is printed once the job is done and the process
sleeps until stdin closes or the time is up, keeping its session.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from eventspark.batch.session import get_session, stop_session
from eventspark.config.models import SparkConfig


def task(index: int, task_sec: float) -> tuple[int, str]:
    time.sleep(task_sec)
    return index, os.path.basename(os.getcwd())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("master")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--task-sec", type=float, default=0.5)
    parser.add_argument("--conf", action="append", default=[])
    parser.add_argument("--hold", type=float, default=0.0)
    args = parser.parse_args()
    conf = dict(item.split("=", 1) for item in args.conf)
    started = time.monotonic()
    session = get_session(SparkConfig(master=args.master, app_name="cluster-test-app", conf=conf))
    session_sec = time.monotonic() - started
    task_sec = args.task_sec
    rdd = session.sparkContext.parallelize(range(args.partitions), args.partitions)
    done = rdd.map(lambda i: task(i, task_sec)).collect()
    report = {
        "app_id": session.sparkContext.applicationId,
        "executors": sorted({executor for _, executor in done}),
        "tasks": len(done),
        "session_sec": round(session_sec, 2),
        "job_sec": round(time.monotonic() - started - session_sec, 2),
    }
    print(json.dumps(report), flush=True)
    if args.hold > 0:
        print("idle", flush=True)
        closed = threading.Event()
        threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
        closed.wait(args.hold)
    stop_session()


if __name__ == "__main__":
    main()
