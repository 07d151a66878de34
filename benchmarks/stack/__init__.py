"""The compose stack run for real on this machine: a private Docker engine, locally built base images, the project's
images, ``docker compose up`` with a CPU override and checks against the running stack (``python -m
benchmarks.stack``; ``make compose-test``). docs/operations.md ("The stack run for real") explains what it shows."""
