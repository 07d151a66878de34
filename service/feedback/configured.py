"""The feedback store the settings name: PostgreSQL when replicas share one, else an embedded SQLite file."""

from __future__ import annotations

from service.config import Settings
from service.feedback.sqlite import SqliteFeedbackStore
from service.feedback.store import FeedbackStore


def open_feedback_store(settings: Settings) -> FeedbackStore:
    """PostgreSQL when ``feedback_url`` is set, else the SQLite file ``feedback_db``."""
    bounds = (settings.feedback_max_rows, settings.feedback_max_age_s, settings.feedback_window)
    if settings.feedback_url is not None:
        from service.feedback.postgres import PostgresFeedbackStore  # psycopg only where it is used

        return PostgresFeedbackStore(settings.feedback_url.get_secret_value(), *bounds)
    return SqliteFeedbackStore(settings.feedback_db, *bounds, busy_timeout_s=settings.feedback_timeout_s)
