"""Offline scoring: one scorer (``Scorer``) that the batch CLI (``service.batch_scoring``) and every engine (Ray Data,
Dask, Spark) share, answering as the server answers."""

from service.scoring.scorer import Scorer
from service.scoring.version import ScoringError

__all__ = ["Scorer", "ScoringError"]
