"""Latency timing of several models in one run (training.evaluate.cost.latencies_per_input_ms)."""

from __future__ import annotations

import torch

from training.evaluate.cost import latencies_per_input_ms


class Recorder(torch.nn.Module):
    """A model that writes its name to a shared log on every forward: ``[S, B, C]`` zeros."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__()
        self.name = name
        self.log = log

    def forward(self, pixels: torch.Tensor, n_samples: int) -> torch.Tensor:
        self.log.append(f"{self.name}:{n_samples}")
        return torch.zeros(n_samples, pixels.shape[0], 3)  # [S, B, C]


def test_every_entry_is_timed_in_turn_on_each_input() -> None:
    log: list[str] = []
    singles = [(torch.randn(1, 4),) for _ in range(3)]
    timed = {"a": (Recorder("a", log), 1), "b": (Recorder("b", log), 4)}

    latencies = latencies_per_input_ms(timed, singles, repeats=2)

    assert set(latencies) == {"a", "b"}
    assert all(ms > 0 for ms in latencies.values())
    warm_up, timings = log[:2], log[2:]
    assert warm_up == ["a:1", "b:4"]
    # interleaved, not one model's inputs after the other's: a drift in machine speed moves both alike
    assert timings == ["a:1", "b:4"] * (len(singles) * 2)
