"""A Temporal worker in a process of its own, for the shared-budget test.

    python temporal_worker.py TEMPORAL_ADDRESS TASK_QUEUE SPEC_JSON

SPEC_JSON names the retry-budget server (`target`), the `tenant`, the
`dependency`, the `policy`, how many times each activity's dependency fails
before it answers (`failures`), the folder where each call is appended to a
file per workflow (`calls_dir`, shared by the workers: an activity's
attempts may run in either) and the attempt log (`attempts`, JSON lines).
Prints `ready` once the worker polls; runs until SIGTERM or stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:  # the installed package (pip install ./clients/python), else this checkout's
    import retry_budget  # noqa: F401 - found installed
except ImportError:
    sys.path.insert(0, os.path.dirname(HERE))

from temporalio import activity  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from retry_budget import Settings  # noqa: E402
from retry_budget.temporal import with_retry_budget  # noqa: E402
from temporal_support import AttemptLog, RunActivity  # noqa: E402


async def main(address: str, queue: str, spec: dict) -> None:
    budget = Settings(spec["target"], tenant=spec["tenant"], dependency=spec["dependency"],
                      policy=spec["policy"])

    @activity.defn(name="charge")
    @with_retry_budget(budget)
    async def charge() -> str:
        info = activity.info()
        path = os.path.join(spec["calls_dir"], info.workflow_id)
        with open(path, "a") as f:  # one attempt at a time: no two writers of one file
            f.write(json.dumps({"attempt": info.attempt, "at": time.time(),
                                "pid": os.getpid()}) + "\n")
        with open(path) as f:
            calls = sum(1 for _ in f)
        if calls <= spec["failures"]:
            raise ConnectionError("dependency failed (call %d)" % calls)
        return "ok"

    client = await Client.connect(address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: sys.stdin.read(1) or stop.set())
    async with Worker(client, task_queue=queue, workflows=[RunActivity], activities=[charge],
                      interceptors=[AttemptLog(spec["attempts"])]):
        print("ready", flush=True)
        await stop.wait()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
