"""A Baton job in Python: reads its run info, logs through the host, checks signal-aborted()
before its side effect, and appends one line to a file in its granted data directory (/data).

Build it into a component with ./build.sh (componentize-py against wit/baton-job.wit). The
environment variable JOB_MODE (granted in the job's TOML) picks a behaviour for the tests:
"spin" works forever without ever asking signal-aborted(), so only the host can stop it.
JOB_URL, if granted, is fetched with an HTTP GET through the host (the job file must allow its
host in allowed_outbound_hosts); the host adds the fence headers itself.
"""

import asyncio
import os
from urllib.parse import urlsplit

import poll_loop
import wit_world
from componentize_py_types import Err
from wit_world.imports import host
from wit_world.imports.types import (
    Fields,
    Method_Get,
    OutgoingRequest,
    Scheme_Http,
    Scheme_Https,
)


async def fetch(url: str) -> tuple[int, bytes]:
    """GETs url through wasi:http and returns its status and body."""
    parts = urlsplit(url)
    request = OutgoingRequest(Fields.from_list([]))
    request.set_method(Method_Get())
    request.set_scheme(Scheme_Https() if parts.scheme == "https" else Scheme_Http())
    request.set_authority(parts.netloc)
    request.set_path_with_query(parts.path + (f"?{parts.query}" if parts.query else ""))
    response = await poll_loop.send(request)
    status = response.status()
    stream = poll_loop.Stream(response.consume())
    body = b""
    while (chunk := await stream.next()) is not None:
        body += chunk
    return status, body


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
        url = os.environ.get("JOB_URL")
        if url:
            loop = poll_loop.PollLoop()
            asyncio.set_event_loop(loop)
            try:
                status, body = loop.run_until_complete(fetch(url))
            except Err as e:  # the host refused the request, or it failed
                raise Err(f"GET {url} failed: {e.value}")
            host.log(host.Level.INFO, f"fetched {url}: {status} {len(body)} bytes")
        if host.signal_aborted():
            raise wit_world.Err("aborted before the side effect")
        if os.path.isdir("/data"):
            with open(f"/data/{info.job}.log", "a") as out:
                out.write(
                    f"python slot={info.slot} attempt={info.attempt} fence={info.fence} "
                    f"runner={info.runner}\n"
                )
