"""The base of every manifest section (``artifact.contract``): unknown keys are kept, so a reader of an older minor
version passes a newer manifest's additions through."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="allow")

    def document(self) -> dict[str, Any]:
        """The JSON object: the keys that were given, in schema order, then any others."""
        return self.model_dump(mode="json", exclude_unset=True)
