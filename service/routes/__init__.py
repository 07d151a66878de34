"""Thin HTTP routers; the logic lives in ``service.serving``."""
