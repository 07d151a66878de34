"""The server's log lines: plain text (the default) or one JSON object per line (``DIRECTOR_LOG_FORMAT=json``), for
log pipelines that index fields (Loki, Elasticsearch, Cloud Logging). A record's ``fields`` extra (the access log's
method, path, status, request id, ...) becomes top-level keys."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
                "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(level: str, json_lines: bool) -> None:
    """The root handler's level and format; uvicorn's own loggers reach it too (see ``service.server``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
