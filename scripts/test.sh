#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh, plus what only tests use), checks lint, format
# and types, and runs the whole test suite, real-model tests included (fast tests run
# first: tests/conftest.py orders them). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The chat's smoke test drives the real app in tmux.
if ! command -v tmux >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y -qq tmux >/dev/null
fi
# Gemma 3 270M has another vocabulary: the tests check that it is refused as a draft.
.venv/bin/localspec pull gemma-3-270m
echo "[test] ruff check, ruff format --check, mypy" >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy localspec tui scripts
exec .venv/bin/pytest --durations=15 "$@"
