"""Entry point: `python -m dagrl_scheduler`."""

import sys


def main() -> int:
    print(
        "dagrl_scheduler: this service is not built yet; its work is tracked in issue 7",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
