"""``python -m training``: the offline pipeline's command line."""

from training.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
