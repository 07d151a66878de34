"""The checks against the running stack, each returning what it measured and whether it passed."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from benchmarks.stack.compose import SERVER, Stack
from benchmarks.stack.daemon import Docker, DockerError
from benchmarks.stack.images import SERVICE_IMAGE
from benchmarks.stack.traffic import Traffic

IMAGE_MODEL, TEXT_MODEL = "fashion-vit", "movie-reviews-minilm"
SMOKE_CONFIG, SMOKE_VERSION = "configs/fashion_vit_smoke.yaml", "7"
HUNG_AFTER_S = 40.0  # a drain still going this long after SIGTERM is hung: its stacks go into the report
TRAINING_STACK = ("timm", "transformers", "torchvision")


@dataclass
class Check:
    name: str
    passed: bool
    detail: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0


def timed(name: str) -> Callable[[Callable[..., Check]], Callable[..., Check]]:
    """Run a check, time it, and turn an exception into a failed check that names it (the run goes on)."""
    def wrap(check: Callable[..., Check]) -> Callable[..., Check]:
        @functools.wraps(check)
        def run(*args: object) -> Check:
            start = time.monotonic()
            try:
                result = check(*args)
            except Exception as error:  # noqa: BLE001 - one failed check must not hide the others' figures
                result = Check(name, False, {"error": f"{type(error).__name__}: {str(error)[-1500:]}"})
            result.seconds = round(time.monotonic() - start, 1)
            return result
        return run
    return wrap


def pixels(rng: np.random.Generator, images: int = 1, noise: bool = False) -> list[dict]:
    """Fashion-MNIST-shaped inputs: uniform noise (far out of distribution) or a dark blob on black (plausible)."""
    out = []
    for _ in range(images):
        if noise:
            image = rng.random((1, 28, 28))
        else:
            image = np.zeros((1, 28, 28))
            image[0, 6:22, 8:20] = rng.uniform(0.3, 0.8)
        out.append({"pixels": image.round(3).tolist()})
    return out


def wait_until(predicate: Callable[[], object], deadline_s: float, pause_s: float = 1.0) -> object:
    """The predicate's first truthy value within the deadline, else None."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            value = predicate()
            if value:
                return value
        time.sleep(pause_s)
    return None


def client(stack: Stack, key: bool = True) -> httpx.Client:
    headers = {"Authorization": f"Bearer {stack.api_key}"} if key else {}
    return httpx.Client(base_url=stack.url, headers=headers, timeout=60)


@timed("serving image carries no training stack")
def serving_image_contents(docker: Docker) -> Check:
    probe = ("import importlib.util as u, json; "
             f"print(json.dumps({{m: u.find_spec(m) is not None for m in {list(TRAINING_STACK)!r}}}))")
    found = json.loads(docker.run("run", "--rm", "--network", "none", "--entrypoint", "python", SERVICE_IMAGE,
                                  "-c", probe).stdout.strip().splitlines()[-1])
    return Check("serving image carries no training stack", not any(found.values()), {"importable": found})


@timed("every healthcheck turns healthy")
def cold_start(stack: Stack) -> Check:
    """``up -d`` from nothing; the seconds until the server answers ready on the published port, then until Docker's
    healthchecks (every 15 s) report every service healthy."""
    start = time.monotonic()
    stack.compose("up", "-d")
    up_s = time.monotonic() - start

    def server_ready() -> bool:
        state = stack.health().get(SERVER)
        if state not in ("starting", "healthy", "running"):  # created but never started, or exited
            raise DockerError(f"the server container is {state}: {stack.logs(SERVER)[-1500:]}")
        return httpx.get(f"{stack.url}/health/ready", timeout=5).status_code == 200

    ready = wait_until(server_ready, 600, 0.25)
    ready_s = time.monotonic() - start
    healthy_s = up_s + stack.wait_healthy({SERVER, "postgres", "prometheus", "alertmanager"}, 600)
    return Check("every healthcheck turns healthy", bool(ready), {
        "compose_up_s": round(up_s, 1), "server_ready_s": round(ready_s, 1), "all_healthy_s": round(healthy_s, 1),
        "services": stack.health()})


@timed("/predict and OIP on the published port")
def predict_and_oip(stack: Stack) -> Check:
    rng = np.random.default_rng(0)
    with client(stack) as http, client(stack, key=False) as anonymous:
        image = http.post("/predict", json={"model": IMAGE_MODEL, "inputs": pixels(rng, 2), "n_samples": 4})
        text = http.post("/predict", json={"model": TEXT_MODEL, "inputs": [{"text": "a warm, funny film"}]})
        tensor = np.asarray(pixels(rng)[0]["pixels"], dtype=np.float32)[None]  # [1, 1, 28, 28]
        oip = http.post(f"/v2/models/{IMAGE_MODEL}/infer", json={"inputs": [
            {"name": "pixels", "datatype": "FP32", "shape": list(tensor.shape), "data": tensor.ravel().tolist()}]})
        refused = anonymous.post("/predict", json={"model": IMAGE_MODEL, "inputs": pixels(rng)})
    fields = {"label", "confidence", "mutual_information", "ood_score", "is_ood"}
    ok = (image.status_code == text.status_code == oip.status_code == 200 and refused.status_code == 401
          and all(fields <= set(p) for p in image.json()["predictions"] + text.json()["predictions"])
          and {o["name"] for o in oip.json()["outputs"]} >= {"probabilities", "ood_score", "is_ood"})
    return Check("/predict and OIP on the published port", ok, {
        "image": image.status_code, "text": text.status_code, "oip": oip.status_code,
        "without_key": refused.status_code, "image_version": image.json().get("model_version")})


@timed("Prometheus scrapes the server")
def prometheus_target(stack: Stack) -> Check:
    def director_up() -> list[dict] | None:
        targets = httpx.get(f"{stack.port_url('PROMETHEUS_PORT')}/api/v1/targets", timeout=5).json()
        found = [t for t in targets["data"]["activeTargets"] if t["labels"]["job"] == "director"]
        return found if found and all(t["health"] == "up" for t in found) else None

    found = wait_until(director_up, 90)
    return Check("Prometheus scrapes the server", bool(found), {
        "targets": [{"url": t["scrapeUrl"], "health": t["health"]} for t in (found or [])]})


class Receiver:
    """Alertmanager's webhook on the host (Slack-compatible payload): every POST body kept."""

    def __init__(self, port: int) -> None:
        received = self.received = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the base class's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append(body.decode(errors="replace"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        # every interface: Alertmanager posts from the compose network to its gateway, an address of this host
        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@timed("OOD-heavy traffic fires an alert into Alertmanager")
def ood_alert(stack: Stack, receiver: Receiver) -> Check:
    rng = np.random.default_rng(1)
    alert = "DirectorOodRateHigh"
    am = stack.port_url("ALERTMANAGER_PORT")

    def in_alertmanager() -> list[dict] | None:
        alerts = httpx.get(f"{am}/api/v2/alerts", params={"filter": f'alertname="{alert}"'}, timeout=5).json()
        return [a for a in alerts if a["labels"].get("model") == IMAGE_MODEL] or None

    headers = {"Authorization": f"Bearer {stack.api_key}"}
    body = {"model": IMAGE_MODEL, "inputs": pixels(rng, 4, noise=True)}
    with Traffic(stack.url, "/predict", lambda: body, headers, clients=1, pause_s=0.2) as traffic:
        fired = wait_until(in_alertmanager, 240, 2.0)
        delivered = fired and wait_until(lambda: any(alert in r for r in receiver.received), 120, 2.0)
    with client(stack) as http:
        flagged = http.post("/predict", json=body).json()["predictions"]
    return Check("OOD-heavy traffic fires an alert into Alertmanager", bool(fired and delivered), {
        "alert": alert, "in_alertmanager": bool(fired), "webhook_notifications": len(receiver.received),
        "flagged_share": sum(p["is_ood"] for p in flagged) / len(flagged), "traffic": traffic.summary()})


@timed("/feedback rows land in PostgreSQL and survive a server restart")
def feedback_survives_restart(stack: Stack) -> Check:
    rng = np.random.default_rng(2)
    with client(stack) as http:
        predicted = http.post("/predict", json={"model": IMAGE_MODEL, "inputs": pixels(rng, 8)}).json()
        labels = [http.post("/feedback", json={"id": predicted["id"], "index": i, "label": p["label"]}).status_code
                  for i, p in enumerate(predicted["predictions"])]
    query = f"SELECT count(*) FROM predictions WHERE request_id = '{predicted['id']}' AND feedback_at IS NOT NULL"
    # the server writes feedback through a bounded queue: give it a moment
    before = wait_until(lambda: int(stack.sql(query)) == len(labels) and int(stack.sql(query)), 30)
    restart_start = time.monotonic()
    stack.compose("restart", SERVER)
    ready = wait_until(lambda: httpx.get(f"{stack.url}/health/ready", timeout=5).status_code == 200, 300, 0.25)
    restart_s = time.monotonic() - restart_start
    after = int(stack.sql(query))

    def live_accuracy() -> str | None:
        metrics = httpx.get(f"{stack.url}/metrics", timeout=5).text
        return next((line for line in metrics.splitlines()
                     if line.startswith("director_live_accuracy_ratio") and f'model="{IMAGE_MODEL}"' in line), None)

    gauge = wait_until(live_accuracy, 60)
    ok = all(code == 200 for code in labels) and before == after == len(labels) and bool(ready) and bool(gauge)
    return Check("/feedback rows land in PostgreSQL and survive a server restart", ok, {
        "feedback_status": sorted(set(labels)), "rows_before_restart": before, "rows_after_restart": after,
        "restart_to_ready_s": round(restart_s, 1), "live_accuracy_after_restart": gauge})


@timed("a training run publishes a version the server picks up, no request lost")
def training_publishes(stack: Stack) -> Check:
    rng = np.random.default_rng(3)
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    body = {"model": IMAGE_MODEL, "inputs": pixels(rng)}
    with Traffic(stack.url, "/predict", lambda: body, headers, clients=2, pause_s=0.05) as traffic:
        start = time.monotonic()
        trained = stack.compose("--profile", "train", "run", "--rm", "train", timeout=3600, check=False,
                                env={"TRAIN_CONFIG": SMOKE_CONFIG, "EXPORT_VERSION": SMOKE_VERSION})
        train_s = time.monotonic() - start

        def default_version() -> bool:
            with client(stack) as http:
                return http.get(f"/models/{IMAGE_MODEL}").json()["default_version"] == SMOKE_VERSION

        served = trained.returncode == 0 and wait_until(default_version, 180)
        picked_s = time.monotonic() - start - train_s
        time.sleep(5)  # requests on the new version
    seen = traffic.summary()
    ok = bool(served) and set(seen["status"]) == {"200"} and SMOKE_VERSION in seen["versions"]
    return Check("a training run publishes a version the server picks up, no request lost", ok, {
        "train_exit": trained.returncode, "train_s": round(train_s, 1), "picked_up_after_s": round(picked_s, 1),
        "traffic": seen, "train_log_tail": (trained.stdout + trained.stderr)[-600:]})


@timed("SIGTERM drains the server")
def sigterm_drains(stack: Stack) -> Check:
    """Requests in flight when ``compose stop`` sends SIGTERM all complete; requests sent afterwards are refused
    at once (the container stops listening), never left hanging."""
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    # texts: requests that take a while, so that some are in flight when the signal comes
    review = "a slow, handsome film whose actors do what they can with a script that never quite decides " * 2
    body = {"model": TEXT_MODEL, "inputs": [{"text": review}] * 8, "n_samples": 8}
    container = stack.container_id(SERVER)
    stacks = ""
    with Traffic(stack.url, "/predict", lambda: body, headers, clients=4) as traffic:
        time.sleep(3)
        signalled = time.monotonic()
        stopping = threading.Thread(target=stack.compose, args=("stop", "--timeout", "60", SERVER))
        stopping.start()
        stopping.join(HUNG_AFTER_S)
        if stopping.is_alive():  # still draining long after its requests were answered: record where it hangs
            stacks = python_stacks(stack.docker, container)
        stopping.join()
        stop_s = time.monotonic() - signalled
        time.sleep(2)
    before, after = traffic.summary(until=signalled), traffic.summary(since=signalled)
    exit_code = int(stack.docker.run("inspect", "--format", "{{.State.ExitCode}}", container).stdout.strip())
    lost = sum(n for status, n in before["status"].items() if status != "200")
    ok = lost == 0 and before["requests"] > 0 and exit_code == 0 and float(after["max_s"]) < 10
    return Check("SIGTERM drains the server", ok, {
        "sent_before_sigterm": before, "sent_after_sigterm": after, "stop_s": round(stop_s, 1),
        "exit_code": exit_code, "log_tail": stack.logs(SERVER)[-800:], "stacks_tail": stacks[-6000:]})


def python_stacks(docker: Docker, container: str) -> str:
    """The server's Python stacks (py-spy, copied in and run with ptrace rights for this one command only: the
    container itself keeps no capability); empty when py-spy is not installed beside this Python."""
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.is_file():
        return ""
    docker.run("cp", str(spy), f"{container}:/tmp/py-spy")
    done = docker.run("exec", "--privileged", "--user", "0", container, "/tmp/py-spy", "dump", "--pid", "1",
                      check=False, timeout=60)
    return done.stdout + done.stderr


@contextlib.contextmanager
def receiving(port: int) -> Iterator[Receiver]:
    receiver = Receiver(port)
    try:
        yield receiver
    finally:
        receiver.close()
