#!/bin/bash
# On a machine with an NVIDIA GPU and no localspec install, the steps named in STEPS
# (default "profile overhead plan"):
#   profile   the cost profiles of the catalog's Q4_K_M shapes (scripts/gpu_profile.py)
#   overhead  the engine's Python per round and a greedy audit on a 7B-shaped pair
#             (scripts/gpu_overhead.py)
#   plan      `localspec plan` there
#   twins     the MoE and hybrid twins' costs and the planner beside them
#             (scripts/gpu_twins.py), then `localspec bench` on the hybrid twin (its MTP
#             head) and the MoE twin (n-grams): greedy = plain, and what auto costs;
#             TWINS_ARGS="--hybrids hybrid,gemma4" adds Gemma 4 12B with its assistant
#   autotrace `auto`'s first rounds and its reasons on the hybrid twin with its MTP head,
#             on the card's own costs (scripts/booked_auto.py --real), then its bench
#   switch    the 1-token passes after a 2-token one, the MTP head attached and not
#             (scripts/gpu_switch.py)
#   moebench  the MoE twin's `localspec bench` (n-grams, auto) alone
#   clients   `localspec serve` with 1, 4 and 8 streaming clients against the CUDA
#             `llama-server -np N` with and without -md, on the 7B twin pair
#             (scripts/serve_bench.py --suite clients --gpu; CLIENTS, ROUNDS, CLIENTS_S)
# Run from the repository root with $OUT set; it expects .gpu/ as scripts/gpu_build.sh
# makes it (the CUDA build of the vendored llama.cpp as lib.tar.xz, llama_cpp's Python
# package in py/, the wheels the machine lacks in whl/, and llama.cpp's
# ggml-vocab-qwen2.gguf, xz'd). TARGETS, PROFILE_S and T7 override what is measured.
set -uo pipefail
exec > >(tee "$OUT/log.txt") 2>&1
step() { echo "=== [$SECONDS s] $*"; }
step setup
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl || exit 1
mkdir -p /tmp/cb && tar -xJf .gpu/lib.tar.xz -C /tmp/cb || exit 1
ln -sfn /tmp/cb/bin .gpu/py/llama_cpp/lib  # llama_cpp's _ggml looks there, whatever the env says
export LLAMA_CPP_LIB_PATH=/tmp/cb/bin PYTHONUNBUFFERED=1
blas=$(find /usr/local /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)
echo "cuBLAS: ${blas:-none found}"
export LD_LIBRARY_PATH=/tmp/cb/bin:/usr/local/cuda/lib64${blas:+:$(dirname "$blas")}:${LD_LIBRARY_PATH:-}
export PYTHONPATH=$PWD/.gpu/py:$PWD:/tmp/site
V=/tmp/ggml-vocab-qwen2.gguf && xz -dc .gpu/ggml-vocab-qwen2.gguf.xz >$V || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem --format=csv
lscpu | grep -E "Model name|^CPU\(s\)"; free -g | head -2; df -h /tmp /dev/shm | tail -2
ldd /tmp/cb/bin/libggml-cuda.so | grep -E "cublas|cudart|libcuda|not found"
python3 -c "import localspec.backends.llama as l; print('gpu offload:', l.supports_gpu_offload())" || exit 1
# the models go where there is room for the 32B (20 GB) beside the kept ones
M=/tmp/shapes; [ "$(df --output=avail -BG /tmp | tail -1 | tr -dc 0-9)" -lt 40 ] && M=/dev/shm/shapes
M=${SHAPES:-$M}
echo "models in $M"
D=qwen2.5-coder-0.5b-instruct; T7=${T7:-qwen2.5-coder-7b-instruct}
STEPS=" ${STEPS:-profile overhead plan} "
if [[ $STEPS == *" profile "* ]]; then
step profile
timeout ${PROFILE_S:-240} python3 scripts/gpu_profile.py --vocab $V --dir $M --out "$OUT/profile.json" \
  --drafts $D,qwen2.5-coder-1.5b-instruct --keep $T7 \
  --targets ${TARGETS:-$T7,qwen2.5-coder-1.5b-instruct,qwen2.5-coder-14b-instruct,qwen2.5-coder-32b-instruct,qwen2.5-coder-3b-instruct}
fi
if [[ $STEPS == *" overhead "* ]]; then
step overhead
timeout 100 python3 scripts/gpu_overhead.py --target $M/$T7-q4_k_m-random.gguf --draft $M/$D-q4_k_m-random.gguf \
  --out "$OUT/overhead" --devices gpu --configs "plain,draft γ4,ngram γ4,auto" --max-tokens 128 --reps 10 --audit
step overhead-4k
timeout 70 python3 scripts/gpu_overhead.py --target $M/$T7-q4_k_m-random.gguf --draft $M/$D-q4_k_m-random.gguf \
  --out "$OUT/overhead-4k" --devices gpu --configs "plain,auto" --max-tokens 128 --reps 10 --context 4000
fi
if [[ $STEPS == *" twins "* ]]; then
step twins
timeout ${TWINS_S:-300} python3 scripts/gpu_twins.py --vocab $V --dir $M \
  --out "$OUT/twins.json" --keep hybrid,moe ${TWINS_ARGS:-}
for kind in hybrid moe; do
  case $kind in
    hybrid) twin=$M/qwen35-0.8b-twin-24l.gguf; modes=baseline,mtp,auto ;;
    moe) twin=$M/qwen3moe-30b-a3b-twin-48l.gguf; modes=baseline,ngram,auto ;;
  esac
  step "bench $kind"
  [ -f "$twin" ] && timeout ${BENCH_S:-100} python3 -m localspec bench --target "$twin" --draft none \
    --modes $modes -n 64 --no-chart --out "$OUT/bench-$kind"
done
fi
if [[ $STEPS == *" autotrace "* ]]; then
step "autotrace: auto's rounds on the hybrid twin, its own costs"
H=$M/qwen35-0.8b-twin-24l.gguf
[ -f "$H" ] || timeout 60 python3 scripts/make_twin_gguf.py --vocab $V --out-dir $M --kind hybrid | tail -1
timeout 60 python3 scripts/booked_auto.py "$H" --real --why ${WHY:-40} ${AUTOTRACE_ARGS:-}
step "bench hybrid"
timeout ${BENCH_S:-100} python3 -m localspec bench --target "$H" --draft none \
  --modes baseline,mtp,auto -n 64 --no-chart --out "$OUT/bench-hybrid" | grep -v "^\["
fi
if [[ $STEPS == *" switch "* ]]; then
step "switch: what a change of pass size costs the passes after it (hybrid twin)"
H=$M/qwen35-0.8b-twin-24l.gguf
[ -f "$H" ] || timeout 60 python3 scripts/make_twin_gguf.py --vocab $V --out-dir $M --kind hybrid | tail -1
timeout 60 python3 scripts/gpu_switch.py "$H" --out "$OUT/switch.json"
fi
if [[ $STEPS == *" moebench "* ]]; then
step "moebench: the MoE twin's bench alone"
MOE=$M/qwen3moe-30b-a3b-twin-48l.gguf
[ -f "$MOE" ] || timeout 120 python3 scripts/make_twin_gguf.py --vocab $V --out-dir $M --kind moe | tail -1
timeout ${BENCH_S:-100} python3 -m localspec bench --target "$MOE" --draft none \
  --modes baseline,ngram,auto -n 64 --no-chart --out "$OUT/bench-moe" | grep -v "^\["
fi
if [[ $STEPS == *" clients "* ]]; then
T=$M/$T7-q4_k_m-random.gguf; DR=$M/$D-q4_k_m-random.gguf
if [ ! -f "$T" ] || [ ! -f "$DR" ]; then
  step "clients: the 7B twin pair"
  timeout 200 python3 scripts/gpu_profile.py --vocab $V --dir $M --out /tmp/pair.json \
    --drafts $D --keep $T7 --targets $T7 --k-max 2 --reps 1 | tail -3
fi
python3 -c "import fastapi, uvicorn, httptools, openai; print('server deps ok')" && /tmp/cb/bin/llama-server --version
for n in ${CLIENTS:-1 4 8}; do
  step "clients $n"
  timeout ${CLIENTS_S:-150} python3 scripts/serve_bench.py --target "$T" --draft "$DR" --gpu \
    --llama-server /tmp/cb/bin/llama-server --suite clients --clients $n --rounds ${ROUNDS:-3} \
    --plain-too --out "$OUT/clients$n.json"
  tail -n 5 "$OUT"/logs/*.log 2>/dev/null; rm -rf "$OUT/logs"  # at most 8 files come back
done
fi
if [[ $STEPS == *" plan "* ]]; then
step plan
for args in "" "--ctx 32768"; do
  echo "--- localspec plan $args"; timeout 60 python3 -m localspec plan $args
done
fi
step done
