"""Entry point: `python -m dagrl_worker --job-id J --redis-url R [--ray-address A]` runs one
job's driver, as `python -m dagrl_worker.driver` does (the scheduler launches that one; see
`dagrl_worker.driver`). The arguments are checked first, so `--help` and usage errors answer
before Ray and torch are imported."""

import sys

from dagrl_worker.driver_args import parse_args


def main() -> int:
    parse_args(sys.argv[1:], prog="python -m dagrl_worker")
    from dagrl_worker.driver import main as run_driver  # Ray and torch: seconds to import

    return run_driver(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
