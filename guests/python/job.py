"""A Baton job in Python: reads its run info, logs through the host, checks signal-aborted()
before its side effect, and appends one line to a file in its granted data directory (/data).

Build it into a component with ./build.sh (componentize-py against wit/baton-job.wit). The
environment variable JOB_MODE (granted in the job's TOML) picks a behaviour for the tests:
"spin" works forever without ever asking signal-aborted(), so only the host can stop it.
"""

import os

import wit_world
from wit_world.imports import host


class WitWorld(wit_world.WitWorld):
    def run(self) -> None:
        info = host.info()
        host.log(
            host.Level.INFO,
            f"hello from python: job {info.job} slot {info.slot} attempt {info.attempt}",
        )
        if os.environ.get("JOB_MODE") == "spin":
            n = 0
            while True:  # never asks: the host must interrupt it
                n += 1
        if host.signal_aborted():
            raise wit_world.Err("aborted before the side effect")
        if os.path.isdir("/data"):
            with open(f"/data/{info.job}.log", "a") as out:
                out.write(
                    f"python slot={info.slot} attempt={info.attempt} fence={info.fence} "
                    f"runner={info.runner}\n"
                )
