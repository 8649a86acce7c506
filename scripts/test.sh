#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh, plus the models only tests use) and runs the
# whole test suite, real-model tests included. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The chat's smoke test drives the real app in tmux.
if ! command -v tmux >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y -qq tmux >/dev/null
fi
# Gemma 3 270M has another vocabulary: the tests check that it is refused as a draft.
.venv/bin/localspec pull gemma-3-270m
exec .venv/bin/pytest "$@"
