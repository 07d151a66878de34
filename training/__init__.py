"""Offline pipeline: data, backbone fitting, DIRECTOR distillation, evaluation and export."""
