"""What a batch costs against its model version's budget. The budget bounds memory by samples, not requests: a
batch's cost is its sampled rows (inputs x n_samples) times the width of its widest input, where the model's batch
runner (``service.engine.modalities``) says what width means: 1 for images (the budget is ``max_batch_samples``
rows), the longest text's tokens rounded up as the batch is padded for texts (the budget is ``max_batch_tokens``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


def unit_width(longest: int) -> int:
    """Inputs without a width: every row costs one."""
    return 1


@dataclass(frozen=True)
class BatchCost:
    budget: int  # one batch's cost; also the bound of one forward
    setting: str  # the setting the budget comes from (``DIRECTOR_`` + its upper case)
    unit: str  # what the cost counts, for error messages
    width: Callable[[int], int] = unit_width  # the widest input's width (``InputBatch.longest``) -> cost per row
    # the most rows one forward can hold (each at the narrowest width): the largest shape bucket
    max_rows: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_rows", max(1, self.budget // self.width(0)))

    def cost(self, rows: int, longest: int) -> int:
        """What ``rows`` sampled rows whose widest input has ``longest`` count against the budget."""
        return rows * self.width(longest)

    def fits(self, rows: int, longest: int) -> bool:
        return self.cost(rows, longest) <= self.budget

    def full(self, rows: int, longest: int) -> bool:
        return self.cost(rows, longest) >= self.budget
