"""Metrics, Triton statistics, drift and logs."""
