"""Baselines on the pipeline's own backbone and stage ``export-baseline``."""
