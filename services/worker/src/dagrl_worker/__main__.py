"""Entry point: `python -m dagrl_worker --job-id J --redis-url R [--ray-address A]` runs one
job's driver (the scheduler's command): `driver_args.main`, which checks the arguments first,
so `--help` and usage errors answer before Ray and torch are imported."""

import sys

from dagrl_worker.driver.main import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], prog="python -m dagrl_worker"))
