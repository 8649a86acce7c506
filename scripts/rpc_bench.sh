#!/usr/bin/env bash
# The RPC bench on one machine: two llama.cpp rpc-servers on 127.0.0.1 hold the
# target's layers (half each), the draft stays in localspec's process, and
# `localspec bench --rpc` runs plain decoding, auto and llama.cpp's speculative example
# on that split once per added round-trip time (a relay on 127.0.0.1, see
# localspec/bench/delay.py). An rpc-server serves one client at a time, so llama.cpp's
# binaries get a second pair set up alike (--peer-rpc); runs take turns, so the pairs
# never compete. Servers are stopped on exit, however it ends.
#
#   scripts/rpc_bench.sh [--rtt-ms 0,1,5] [--out DIR] [--server-threads N] [BENCH ARGS...]
#
# BENCH ARGS go to every `localspec bench` run (default: --modes baseline,auto,peer
# --only code); each run writes DIR/rtt-<ms>ms/bench.{md,json,png}.
set -euo pipefail
cd "$(dirname "$0")/.."

rtts=0,1,5 out="" server_threads=2 bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rtt-ms) rtts=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --server-threads) server_threads=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) bench_args+=("$1"); shift ;;
  esac
done
[ ${#bench_args[@]} -gt 0 ] || bench_args=(--modes baseline,auto,peer --only code)
out=${out:-$HOME/.local/share/localspec/bench/rpc-$(date +%Y%m%d-%H%M%S)}

free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
endpoints=()
for _ in 1 2 3 4; do
  port=$(free_port)
  # The servers take turns (a pass runs through the layers in order), so each may use
  # every core.
  .venv/bin/python -m localspec.backends.rpc_server --host 127.0.0.1 --port "$port" --device CPU --threads "$server_threads" \
    >"${TMPDIR:-/tmp}/rpc-server-$port.log" 2>&1 &
  pids+=($!)
  endpoints+=("127.0.0.1:$port")
done
for e in "${endpoints[@]}"; do  # up when it accepts a connection
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/${e%:*}/${e#*:}") 2>/dev/null && break
    sleep 0.1
  done
done
rpc="${endpoints[0]},${endpoints[1]}" peer_rpc="${endpoints[2]},${endpoints[3]}"
echo "[rpc-bench] servers at $rpc (the peer's at $peer_rpc); reports under $out" >&2
IFS=, read -ra rtt_list <<<"$rtts"
for rtt in "${rtt_list[@]}"; do
  echo "[rpc-bench] +$rtt ms round trip" >&2
  .venv/bin/localspec bench --rpc "$rpc" --peer-rpc "$peer_rpc" --rpc-rtt-ms "$rtt" \
    --out "$out/rtt-${rtt}ms" \
    "${bench_args[@]}" >/dev/null
done
echo "[rpc-bench] done: $out/rtt-*ms/bench.md" >&2
