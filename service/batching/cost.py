"""What a batch costs against the version's budget. The budget bounds memory by samples, not requests: image models
``max_batch_samples`` sampled rows (inputs x n_samples), text models ``max_batch_tokens`` padded tokens x samples
(rows x the batch's longest text rounded up to a multiple of 8, as ``service.texts`` pads it)."""

from __future__ import annotations

from dataclasses import dataclass

from service.artifact import Artifact
from service.texts import padded_length


@dataclass(frozen=True)
class BatchCost:
    max_batch_samples: int  # image models' budget; also the row bound of one image forward
    max_batch_tokens: int  # text models' budget; also the token bound of one text forward
    max_length: int | None  # text models: the artifact's max_length (the widest padding); None for image models

    @classmethod
    def of(cls, artifact: Artifact, max_batch_samples: int, max_batch_tokens: int) -> BatchCost:
        text = artifact.text
        return cls(max_batch_samples, max_batch_tokens, text.max_length if text is not None else None)

    def cost(self, rows: int, longest: int) -> int:
        """What ``rows`` sampled rows whose longest text has ``longest`` tokens count against the budget."""
        if self.max_length is None:
            return rows
        return rows * padded_length(longest, self.max_length)

    def fits(self, rows: int, longest: int) -> bool:
        return self.cost(rows, longest) <= self.budget

    def full(self, rows: int, longest: int) -> bool:
        return self.cost(rows, longest) >= self.budget

    @property
    def budget(self) -> int:
        """One batch's cost: sampled rows (images) or padded tokens x samples (texts)."""
        return self.max_batch_samples if self.max_length is None else self.max_batch_tokens

    @property
    def unit(self) -> str:
        return "sampled rows (inputs x n_samples)" if self.max_length is None else \
            "padded tokens x samples (inputs x n_samples x the longest text's tokens, rounded up to 8)"
