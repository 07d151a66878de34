"""The one inference device of this process: its lock, autocast policy, batch shapes, host<->device copies and
out-of-memory handling; and the choice of it at startup, which refuses a GPU that does not work rather than fall
back to the CPU when CUDA was asked for."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from service.engine.shapes import BatchShapes

log = logging.getLogger("service.engine.device")

NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")


@dataclass(frozen=True)
class DeviceDefaults:
    """What a setting left unset means on a device type (see docs/operations.md, "Per-device defaults")."""

    max_batch_samples: int
    max_batch_tokens: int
    shape_buckets: bool


# CPU: measured optima of a 2-core machine (docs/benchmarks.md, docs/benchmarks-text.md); padding would only add
# work there. CUDA: a forward's time hardly grows with its rows until the device fills, so the budgets are 8x the
# CPU's and counts are padded to buckets; the figures are to be confirmed by benchmarks/gpu_check.sh.
DEVICE_DEFAULTS = {
    "cpu": DeviceDefaults(max_batch_samples=128, max_batch_tokens=2048, shape_buckets=False),
    "cuda": DeviceDefaults(max_batch_samples=1024, max_batch_tokens=16384, shape_buckets=True),
}


class DeviceUnavailable(RuntimeError):
    """The configured device cannot be used; the message says why and what to check."""


class DeviceOutOfMemory(RuntimeError):
    """A forward ran out of device memory; that batch failed, the device and the server go on."""


class ForwardGate:
    """Who may run a forward on a device: up to ``slots`` shared holders at once (unseeded forwards of different
    models: on a CPU whose cores are more than one forward's torch threads, one model's long forward then leaves
    cores to another model's), or one exclusive holder (a seeded batch, which needs the global generator to itself
    for all its forwards; warm-ups). An exclusive request waits for the shared holders and keeps new ones out, so
    it is not starved. ``acquire`` / ``release`` / ``locked`` and ``with gate:`` are the exclusive side, as on a
    ``threading.Lock``."""

    def __init__(self, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"a forward gate needs at least one slot, got {slots}")
        self.slots = slots
        self._condition = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._exclusive_waiting = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        with self._condition:
            self._exclusive_waiting += 1
            try:
                free = lambda: not self._exclusive and self._shared == 0  # noqa: E731
                got = self._condition.wait_for(free, None if timeout < 0 else timeout) if blocking else free()
                if got:
                    self._exclusive = True
                return got
            finally:
                self._exclusive_waiting -= 1
                self._condition.notify_all()

    def release(self) -> None:
        with self._condition:
            if not self._exclusive:
                raise RuntimeError("release of a forward gate that is not held exclusively")
            self._exclusive = False
            self._condition.notify_all()

    def locked(self) -> bool:
        """Whether it is held exclusively."""
        return self._exclusive

    @property
    def exclusive_waiting(self) -> int:
        """How many exclusive requests wait for the gate (they keep new shared turns out)."""
        return self._exclusive_waiting

    def __enter__(self) -> ForwardGate:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """One of the ``slots`` shared turns, once no exclusive holder has or waits for the gate."""
        with self._condition:
            self._condition.wait_for(lambda: not self._exclusive and self._exclusive_waiting == 0
                                     and self._shared < self.slots)
            self._shared += 1
        try:
            yield
        finally:
            with self._condition:
                self._shared -= 1
                self._condition.notify_all()


def cpu_forward_slots(torch_threads: int, cores: int | None = None) -> int:
    """How many forwards fit side by side on this CPU: its cores over one forward's torch threads (torch's own
    default uses every core: one slot)."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // torch_threads) if torch_threads > 0 else 1


@dataclass
class Device:
    """Forwards on one device take turns at ``lock`` (``ForwardGate``): unseeded ones share it up to its slots, a
    seeded batch holds it alone, since it needs the global RNG to itself for the length of its forwards."""

    torch_device: torch.device
    bf16: bool = False
    shapes: BatchShapes = field(default_factory=lambda: BatchShapes(128, 2048, buckets=False))
    lock: ForwardGate = field(default_factory=ForwardGate)
    on_out_of_memory: Callable[[], None] | None = None  # counts OOMs (set by the app to its metric)

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.bf16 and self.is_cuda:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                yield
        else:
            yield

    @contextlib.contextmanager
    def guard_memory(self) -> Iterator[None]:
        """Turn an out-of-memory error of the block into ``DeviceOutOfMemory`` after returning the allocator's
        cached blocks, so the next batch starts from a clean cache."""
        try:
            yield
        except torch.OutOfMemoryError as exc:
            if self.is_cuda:
                torch.cuda.empty_cache()
            if self.on_out_of_memory is not None:
                self.on_out_of_memory()
            raise DeviceOutOfMemory(f"out of memory on {self.torch_device}: {str(exc).splitlines()[0]}") from exc

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device: on CUDA staged through pinned memory, so the copy is asynchronous (from
        pageable memory ``non_blocking`` would still wait). Pinned blocks come from torch's caching host
        allocator, so staging reuses them."""
        if not self.is_cuda:
            return tensor
        return tensor.pin_memory().to(self.torch_device, non_blocking=True)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A device tensor on the host: one asynchronous copy into pinned memory and one synchronisation."""
        if not self.is_cuda:
            return tensor
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        torch.cuda.current_stream(self.torch_device).synchronize()
        return host

    def memory_stats(self) -> tuple[int, int, int] | None:
        """(allocated, reserved by the caching allocator, peak allocated) bytes, or None off CUDA."""
        if not self.is_cuda:
            return None
        return (int(torch.cuda.memory_allocated(self.torch_device)), int(torch.cuda.memory_reserved(self.torch_device)),
                int(torch.cuda.max_memory_allocated(self.torch_device)))


def cuda_problem() -> str | None:
    """None when a CUDA device works (a tensor op ran on it), else why not, with what was found: torch's CUDA
    build, the driver the kernel module reports, ``nvidia-smi``, and the warning torch gave while probing."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    error = "; ".join(str(w.message).strip() for w in caught)
    if available:
        try:
            (torch.ones(1, device="cuda") + 1).item()  # a kernel of this build for this GPU's architecture
            return None
        except RuntimeError as exc:
            error = f"{error}; {str(exc).splitlines()[0]}" if error else str(exc).splitlines()[0]
    facts = [f"torch {torch.__version__} is built for CUDA {torch.version.cuda or 'none (a CPU-only build)'}"]
    if NVIDIA_DRIVER_FILE.is_file():
        facts.append("kernel driver: " + NVIDIA_DRIVER_FILE.read_text(errors="replace").splitlines()[0].strip())
    else:
        facts.append(f"no NVIDIA driver visible ({NVIDIA_DRIVER_FILE} is absent: no GPU was passed to this "
                     "container or host)")
    facts.append(nvidia_smi())
    if error:
        facts.append(f"torch says: {error}")
    return ("CUDA is not usable: " + "; ".join(facts) + ". The driver must support the CUDA version torch is built "
            "for (docs/operations.md, \"GPU hosts\", gives the minimum driver); set DIRECTOR_DEVICE=cpu to serve on "
            "the CPU deliberately.")


def nvidia_smi() -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi not found"
    try:
        result = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"
    out = (result.stdout or result.stderr).strip().replace("\n", " | ")
    return f"nvidia-smi: {out or 'no output'} (exit {result.returncode})"


def resolve_device(name: str, bf16: bool, torch_threads: int, max_batch_samples: int | None = None,
                   max_batch_tokens: int | None = None, shape_buckets: bool | None = None,
                   concurrent_forwards: int = 0) -> Device:
    """The device ``name`` names (``auto``: CUDA when it works, else the CPU), with the per-device defaults for
    the batch settings left unset. ``cuda`` that does not work raises ``DeviceUnavailable``: never the CPU.
    ``concurrent_forwards`` (0: by device) is how many models' forwards may run at once: on a CPU its cores over
    ``torch_threads``, on CUDA one (kernels of one process queue on the same device anyway)."""
    if torch_threads > 0:
        torch.set_num_threads(torch_threads)
    kind = "cpu"
    if name in ("cuda", "auto"):
        problem = cuda_problem()
        if problem is None:
            kind = "cuda"
        elif name == "cuda":
            raise DeviceUnavailable(f"DIRECTOR_DEVICE=cuda, but {problem}")
        elif torch.version.cuda is not None and NVIDIA_DRIVER_FILE.is_file():
            log.warning("DIRECTOR_DEVICE=auto serves on the CPU although a GPU driver is present: %s", problem)
    defaults = DEVICE_DEFAULTS[kind]
    shapes = BatchShapes(max_batch_samples or defaults.max_batch_samples,
                         max_batch_tokens or defaults.max_batch_tokens,
                         defaults.shape_buckets if shape_buckets is None else shape_buckets)
    if kind == "cpu":
        slots = concurrent_forwards or cpu_forward_slots(torch_threads)
        return Device(torch.device("cpu"), bf16=False, shapes=shapes, lock=ForwardGate(slots))
    # TF32 tensor cores for fp32 matmuls and convolutions: about 1e-3 relative error, far inside what sampling adds
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    return Device(torch.device("cuda"), bf16=bf16, shapes=shapes, lock=ForwardGate(concurrent_forwards or 1))
