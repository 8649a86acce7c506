#!/usr/bin/env bash
# Serves this machine's device to another machine's `localspec run --rpc HOST:PORT`:
# llama.cpp's rpc-server, run on the llama.cpp localspec runs on (scripts/setup.sh builds
# it with RPC; localspec/backends/rpc_server.py), so both ends speak the same protocol.
#
#   scripts/rpc_server.sh [--host 127.0.0.1] [--port 50052] [--device CPU]
#       [--threads N] [--cache]
#
# --device: which local device it serves (llama.cpp's names: CPU, CUDA0, Metal, ...);
# default: llama.cpp's choice. --cache: keep received tensors in llama.cpp's local
# cache, so the next load of the same model skips the transfer.
# The RPC protocol has no authentication: bind to 127.0.0.1 or a network you trust.
set -euo pipefail
cd "$(dirname "$0")/.."

host=127.0.0.1 port=50052 device="" threads="" cache=0
while [ $# -gt 0 ]; do
  case "$1" in
    --host) host=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --cache) cache=1; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "rpc_server.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

# an rpc host needs llama.cpp, not the default pair
.venv/bin/python -c 'import localspec' 2>/dev/null || LOCALSPEC_SKIP_MODELS=1 ./scripts/setup.sh
args=(--host "$host" --port "$port")
[ -z "$device" ] || args+=(--device "$device")
[ -z "$threads" ] || args+=(--threads "$threads")
[ "$cache" = 0 ] || args+=(--cache)
exec .venv/bin/python -m localspec.backends.rpc_server "${args[@]}"
