"""How far one image request walks through the server's code: the sequence of ``service/`` files its calls enter,
on every thread (event loop, decode pool, batch worker), from the request's first byte to its answer.

``python -m benchmarks.request_walk [--root PATH] [--requests N]``: the app of the ``service`` package found under
``--root`` (this checkout by default; point it at an older checkout to compare) on the committed repository, one
warm-up upload, then ``N`` (5) measured ``POST /predict/image`` of ``examples/trouser.png``. A *stay* is a run of
consecutive calls in one file; a *return* is a stay in a file the request had already been in. Prints the walk of the
measured request with the fewest returns and one JSON line (with every measured request's returns); the figures go to
docs/architecture.md ("A request through the server").

Why several requests and the fewest: the server's own background tasks run on the same threads, and the recording
takes every call. Each request's prediction log is written within 0.1 s after it (so every measured request waits
0.3 s first, and the previous request's write is not inside it), but the log writer also wakes every 0.1 s with
nothing to write, and such a wake-up falls inside some requests and not others. The fewest is the request's own
walk; a wake-up never makes one shorter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class Walk:
    """Records the ``service/`` file of every Python call on every thread while ``on``."""

    def __init__(self, package: Path) -> None:
        self.package = str(package) + "/"
        self.on = False
        self.files: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.on and event == "call" and frame.f_code.co_filename.startswith(self.package):
            with self.lock:
                self.files.append(frame.f_code.co_filename.removeprefix(self.package))

    def take(self) -> list[str]:
        """The stays recorded so far (the recording starts afresh)."""
        with self.lock:
            files, self.files = self.files, []
        out: list[str] = []
        for name in files:
            if not out or out[-1] != name:
                out.append(name)
        return out


def summary(stays: list[str]) -> dict[str, Any]:
    seen: set[str] = set()
    returns = 0
    for name in stays:
        returns += name in seen
        seen.add(name)
    return {"stays": len(stays), "files": len(seen), "returns": returns}


async def measure(walk: Walk, requests: int) -> list[list[str]]:
    """The stays of each of ``requests`` measured requests, after one warm-up request."""
    import httpx

    from service.app import create_app
    from service.config import Settings

    image = (ROOT / "examples" / "trouser.png").read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(model_repository=ROOT / "model_repository", poll_interval_s=0, torch_threads=1,
                            feedback_db=Path(tmp) / "feedback.sqlite3", default_model="fashion-vit")
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            state = app.state.director
            while not state.repository.scanned_once:
                await asyncio.sleep(0.05)
            transport = httpx.ASGITransport(app=app)
            walks = []
            async with httpx.AsyncClient(transport=transport, base_url="http://walk") as client:
                files = {"file": ("trouser.png", image, "image/png")}
                assert (await client.post("/predict/image", files=files)).status_code == 200  # warm-up
                for _ in range(requests):
                    await asyncio.sleep(0.3)  # the previous request's prediction log is written meanwhile
                    walk.on = True
                    response = await client.post("/predict/image", files=files)
                    walk.on = False
                    assert response.status_code == 200, response.text
                    walks.append(walk.take())
    return walks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose service package is measured")
    parser.add_argument("--requests", type=int, default=5, help="measured requests (the walk with fewest returns)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    sys.path.insert(0, str(root))
    walk = Walk(root / "service")
    threading.setprofile(walk)  # every thread started from here on (the pools start lazily)
    sys.setprofile(walk)
    walks = asyncio.run(measure(walk, args.requests))
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    counted = [summary(stays) for stays in walks]
    fewest = min(range(len(walks)), key=lambda i: counted[i]["returns"])
    print(" -> ".join(walks[fewest]))
    print(json.dumps({"root": str(args.root), **counted[fewest],
                      "returns_each": [c["returns"] for c in counted]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
