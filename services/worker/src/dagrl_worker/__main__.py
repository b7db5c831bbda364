"""Entry point: `python -m dagrl_worker --job-id J --redis-url R` runs one job's driver
(the scheduler launches it this way; see `dagrl_worker.driver`)."""

from dagrl_worker.driver import main

if __name__ == "__main__":
    raise SystemExit(main())
