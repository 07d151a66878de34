"""Dynamic batching for one model version: slot reservation (``slots``) and the worker that drains the queue into
forwards within the batch cost's budget (``worker``; the cost is ``service.engine.batch_cost``)."""

from service.engine.batching.items import BatchResult, BatchStats, WorkItem
from service.engine.batching.slots import QueueFull, Slots, Ticket
from service.engine.batching.worker import BatchWorker, Draining

__all__ = ["BatchResult", "BatchStats", "BatchWorker", "Draining", "QueueFull", "Slots", "Ticket", "WorkItem"]
