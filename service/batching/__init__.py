"""Dynamic batching for one model version: slot reservation (``slots``), the cost of a batch against its budget
(``cost``) and the worker that drains the queue into forwards (``worker``)."""

from service.batching.cost import BatchCost
from service.batching.slots import QueueFull, Slots, Ticket
from service.batching.worker import (
    BatchResult,
    BatchStats,
    BatchWorker,
    Draining,
    Inputs,
    WorkItem,
    input_count,
    longest_text,
)

__all__ = ["BatchCost", "BatchResult", "BatchStats", "BatchWorker", "Draining", "Inputs", "QueueFull", "Slots",
           "Ticket", "WorkItem", "input_count", "longest_text"]
