"""Stage ``evaluate``: DIRECTOR against the baselines on test, shift and OOD sets, costs and ablations."""
