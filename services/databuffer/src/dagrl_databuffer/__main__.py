"""Entry point: `python -m dagrl_databuffer`."""

import sys


def main() -> int:
    print(
        "dagrl_databuffer: this service is not built yet; its work is tracked in issue 3",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
