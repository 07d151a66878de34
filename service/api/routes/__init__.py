"""Thin HTTP routers: each translates its protocol to raw inputs and back; the prediction use-case is
``service.engine.predictor``."""
