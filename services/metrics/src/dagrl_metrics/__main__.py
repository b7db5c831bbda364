"""Entry point: `python -m dagrl_metrics`."""

import sys


def main() -> int:
    print(
        "dagrl_metrics: this service is not built yet; its work is tracked in issue 5",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
