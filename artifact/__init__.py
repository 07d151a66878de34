"""The artifact contract between the exporter (``training``) and the server (``service``), in ``artifact.contract``.

Standard library and pydantic only, so both sides import it without importing each other or ``models``."""
