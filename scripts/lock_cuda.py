"""`make lock-cuda`: resolve requirements/cuda.in for a GPU machine into requirements/lock-cuda.txt.

pip resolves without installing (`--dry-run --ignore-installed --report`), from package
metadata alone, so any Linux x86_64 machine with Python 3.11 can pin the CUDA set. Local
wheel folders and the CPU torch's index that a CPU machine's pip may be configured with are
switched off for the run: the CUDA lock must hold what PyPI serves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "lock-cuda.txt"
HEADER = ("# The CUDA install's exact set (`make install DEVICE=cuda`), resolved from "
          "requirements/cuda.in\n# for Linux x86_64 and Python 3.11 by `make lock-cuda` "
          "(scripts/lock_cuda.py). Do not edit.\n")


def main() -> int:
    environment = {**os.environ, "PIP_CONSTRAINT": "", "PIP_FIND_LINKS": "",
                   "PIP_EXTRA_INDEX_URL": ""}
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                   "--quiet", "--report", str(report), "-r",
                   str(ROOT / "requirements" / "cuda.in")]
        code = subprocess.call(command, env=environment)
        if code != 0:
            print("lock-cuda: pip could not resolve requirements/cuda.in", file=sys.stderr)
            return code
        pins = sorted(f"{item['metadata']['name']}=={item['metadata']['version']}"
                      for item in json.loads(report.read_text())["install"])
    LOCK.write_text(HEADER + "\n".join(pins) + "\n")
    print(f"lock-cuda: {len(pins)} packages pinned in {LOCK.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
