"""Entry point: `python -m dagrl_worker`."""

import sys


def main() -> int:
    print(
        "dagrl_worker: this service is not built yet; its work is tracked in issue 4",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
