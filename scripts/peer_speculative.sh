#!/usr/bin/env bash
# The peer to beat: llama.cpp's own speculative example, built from the llama.cpp
# sources vendored in the llama-cpp-python sdist (the same llama.cpp localspec runs on),
# run on the bench prompts next to plain decoding by llama.cpp's own completion tool.
#
#   scripts/peer_speculative.sh build [TARGET...]   (default: all, llama-server included)
#   scripts/peer_speculative.sh bindir               (where the binaries are)
#   scripts/peer_speculative.sh run --target T.gguf --draft D.gguf [--prompts FILE]
#       [--only name1,name2] [--max-tokens 128] [--threads 2] [--n-max 3] [--repeats 1]
#       [--out FILE.json]
#
# `build` takes ~5 minutes on 2 cores (run it in the background); binaries and sources
# live in $LOCALSPEC_PEER_DIR (default ~/.cache/localspec/peer), never in the repo.
# `run` prints one line per prompt and writes a JSON that `localspec bench --peer FILE`
# puts next to its own figures (tokens/s, prompt for prompt).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_VERSION=${LLAMA_CPP_VERSION:-0.3.36}
PEER_DIR=${LOCALSPEC_PEER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/localspec/peer}
SRC="$PEER_DIR/llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp"
BUILD="$PEER_DIR/build-$LLAMA_CPP_VERSION"
PY=${PYTHON:-$PWD/.venv/bin/python}
# The bench's peers, and llama-server (the server benchmark's peer). llama.cpp's
# rpc-server needs no build: localspec runs it on its own llama.cpp (rpc_server.sh).
TARGETS=(llama-speculative-simple llama-completion llama-server)
RUN_TARGETS=(llama-speculative-simple llama-completion)
log() { printf '[peer] %s\n' "$*" >&2; }

build() {  # [target...]
  local targets=("$@")
  [ ${#targets[@]} -gt 0 ] || targets=("${TARGETS[@]}")
  mkdir -p "$PEER_DIR"
  if [ ! -f "$SRC/CMakeLists.txt" ]; then
    log "fetching the llama-cpp-python $LLAMA_CPP_VERSION sdist"
    "$PY" -m pip download --quiet --no-deps --no-binary :all: \
      "llama-cpp-python==$LLAMA_CPP_VERSION" -d "$PEER_DIR/sdist"
    tar xzf "$PEER_DIR/sdist/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz" -C "$PEER_DIR"
  fi
  # The same CPU rule as scripts/setup.sh: native, except where the CPU advertises AMX,
  # whose matmul crashes on multi-token batches on some virtualised CPUs (llama.cpp#20824).
  local args=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_SERVER=ON -DGGML_RPC=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF)
  if [ -r /proc/cpuinfo ] && grep -qw amx_tile /proc/cpuinfo; then
    local flags; flags=$(grep -m1 '^flags' /proc/cpuinfo)
    has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
    args+=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
      "-DGGML_AVX=$(has avx)" "-DGGML_AVX2=$(has avx2)" "-DGGML_FMA=$(has fma)"
      "-DGGML_F16C=$(has f16c)" "-DGGML_BMI2=$(has bmi2)" "-DGGML_AVX_VNNI=$(has avx_vnni)"
      "-DGGML_AVX512=$(has avx512f)" "-DGGML_AVX512_VBMI=$(has avx512vbmi)"
      "-DGGML_AVX512_VNNI=$(has avx512_vnni)" "-DGGML_AVX512_BF16=$(has avx512_bf16)")
    log "CPU advertises AMX: building without it (explicit ISA flags)"
  else
    args+=(-DGGML_NATIVE=ON)
  fi
  patch_draft_budget
  log "configuring in $BUILD"
  cmake -S "$SRC" -B "$BUILD" -G Ninja "${args[@]}" >"$PEER_DIR/configure.log" 2>&1
  log "building ${targets[*]} (minutes; log in $PEER_DIR/build.log)"
  nice -n 10 cmake --build "$BUILD" -j "$(nproc 2>/dev/null || echo 2)" \
    --target "${targets[@]}" >"$PEER_DIR/build.log" 2>&1 \
    || { tail -20 "$PEER_DIR/build.log" >&2; log "build failed (log: $PEER_DIR/build.log)"; exit 1; }
  log "built: $BUILD/bin"
}

# The speculative example caps each draft to the tokens left to decode, but llama.cpp reads
# a cap of 0 as "no limit" (common_speculative_draft), so its last rounds draft a full
# --spec-draft-n-max and it ran up to n_max tokens past -n. Skip drafting when nothing is
# left, as llama-server does (`if (n_draft_max > 0)`): then it stops after exactly -n + 1
# tokens (its loop ends once n_predict > -n), and `run` and localspec bench pass -n N-1.
patch_draft_budget() {
  local file="$SRC/examples/speculative-simple/speculative-simple.cpp"
  grep -q 'localspec: draft budget' "$file" && return
  sed -i 's|^\( *\)common_speculative_draft(spec);|\1if (n_draft_max > 0) { common_speculative_draft(spec); }  // localspec: draft budget|' "$file"
  grep -q 'localspec: draft budget' "$file" || { log "could not patch $file"; exit 1; }
}

# Each prompt rendered with the target's chat template, one file per prompt, so both
# binaries see exactly the text localspec's bench decodes (special tokens included).
render_prompts() {  # target prompts_file only out_dir
  "$PY" - "$@" <<'EOF'
import json, sys
from pathlib import Path
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

target, prompts_file, only, out = sys.argv[1:5]
prompts = json.loads(Path(prompts_file).read_text())
names = only.split(",") if only else list(prompts)
vocab = Llama(target, vocab_only=True, verbose=False)
template = vocab.metadata["tokenizer.chat_template"]
eos = vocab._model.token_get_text(vocab.token_eos())
fmt = Jinja2ChatFormatter(template, eos_token=eos, bos_token="", add_generation_prompt=True)
for name in names:
    if name not in prompts:
        sys.exit(f"no prompt named {name!r} in {prompts_file}")
    text = fmt(messages=[{"role": "user", "content": prompts[name]["prompt"]}]).prompt
    # llama.cpp's -f drops one trailing newline, and the generation prompt ends in one
    Path(out, f"{name}.txt").write_text(text + "\n")
    print(name, prompts[name].get("category", ""))
EOF
}

# The decode speed each binary reports: the speculative example's "decoded N tokens in
# T seconds" (everything after the prompt), llama.cpp's perf line "eval time" for plain
# decoding (the prompt's evaluation excluded the same way).
spec_speed() { sed -n 's/.*decoded *\([0-9]*\) tokens in *\([0-9.]*\) seconds, speed: *\([0-9.]*\) t\/s.*/\1 \3/p' "$1" | tail -1; }
spec_accept() { sed -n 's/.*accept *= *\([0-9.]*\)%.*/\1/p' "$1" | tail -1; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 }
  END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
plain_speed() { grep -v 'prompt eval' "$1" | sed -n 's/.* eval time = .*\/ *\([0-9]*\) runs .*, *\([0-9.]*\) tokens per second.*/\1 \2/p' | tail -1; }

run() {
  local target="" draft="" prompts="localspec/data/bench_prompts.json" only="" n=128 threads=2
  local n_max=3 out="" repeats=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --target) target=$2; shift 2 ;;
      --draft) draft=$2; shift 2 ;;
      --prompts) prompts=$2; shift 2 ;;
      --only) only=$2; shift 2 ;;
      --max-tokens) n=$2; shift 2 ;;
      --threads) threads=$2; shift 2 ;;
      --n-max) n_max=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      --repeats) repeats=$2; shift 2 ;;
      *) log "unknown option $1"; exit 2 ;;
    esac
  done
  [ -n "$target" ] && [ -n "$draft" ] || { log "run needs --target and --draft"; exit 2; }
  for t in "${RUN_TARGETS[@]}"; do
    [ -x "$BUILD/bin/$t" ] || { log "$t is not built: run '$0 build' first"; exit 1; }
  done
  local work; work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  # llama.cpp logs to stderr even with verbose=False: keep it for when rendering fails
  render_prompts "$target" "$prompts" "$only" "$work" >"$work/names" 2>"$work/render.log" \
    || { cat "$work/render.log" >&2; exit 1; }
  local rows=()
  printf '%-22s %-10s %10s %10s %8s %8s\n' prompt category plain_tps spec_tps speedup accept
  while read -r name category; do
    local common=(-m "$target" -f "$work/$name.txt" -t "$threads" -c 4096
      --temp 0 --top-k 1 --seed 1 -ngl 0)
    local plain_runs=() spec_runs=() plain_n spec_n plain_tps spec_tps accept
    for ((r = 0; r < repeats; r++)); do  # interleaved, like localspec bench
      "$BUILD/bin/llama-completion" "${common[@]}" -n "$n" -tb "$threads" -no-cnv \
        >"$work/$name.plain.log" 2>&1 </dev/null
      "$BUILD/bin/llama-speculative-simple" "${common[@]}" -n "$((n - 1))" \
        -md "$draft" -td "$threads" \
        --spec-type draft-simple --spec-draft-n-max "$n_max" \
        >"$work/$name.spec.log" 2>&1 </dev/null
      read -r plain_n plain_tps <<<"$(plain_speed "$work/$name.plain.log")"
      read -r spec_n spec_tps <<<"$(spec_speed "$work/$name.spec.log")"
      accept=$(spec_accept "$work/$name.spec.log")
      if [ -z "${plain_tps:-}" ] || [ -z "${spec_tps:-}" ]; then
        log "$name: could not read the speeds; logs kept in $PEER_DIR/failed-$name.*.log"
        cp "$work/$name.plain.log" "$PEER_DIR/failed-$name.plain.log"
        cp "$work/$name.spec.log" "$PEER_DIR/failed-$name.spec.log"
        exit 1
      fi
      plain_runs+=("$plain_tps") spec_runs+=("$spec_tps")
    done
    plain_tps=$(median "${plain_runs[@]}") spec_tps=$(median "${spec_runs[@]}")
    printf '%-22s %-10s %10.2f %10.2f %7.2fx %7s%%\n' "$name" "$category" "$plain_tps" \
      "$spec_tps" "$(echo "$spec_tps / $plain_tps" | bc -l)" "$accept"
    rows+=("$name $category $plain_n $spec_n ${accept:-0} $(IFS=,; echo "${plain_runs[*]}") $(IFS=,; echo "${spec_runs[*]}")")
  done <"$work/names"
  if [ -n "$out" ]; then
    printf '%s\n' "${rows[@]}" | "$PY" -c '
import json, statistics, sys
rows = [line.split() for line in sys.stdin if line.strip()]
def runs(text):
    return [float(v) for v in text.split(",")]
print(json.dumps({
    "peer": "llama-speculative-simple --spec-type draft-simple --spec-draft-n-max " + sys.argv[1],
    "target": sys.argv[2], "draft": sys.argv[3], "max_tokens": int(sys.argv[4]),
    "threads": int(sys.argv[5]),
    "prompts": {r[0]: {"category": r[1], "plain_tokens": int(r[2]), "spec_tokens": int(r[3]),
                       "acceptance": float(r[4]) / 100,
                       "plain_tps": statistics.median(runs(r[5])), "plain_tps_runs": runs(r[5]),
                       "spec_tps": statistics.median(runs(r[6])), "spec_tps_runs": runs(r[6])}
                for r in rows},
}, indent=2))' "$n_max" "$target" "$draft" "$n" "$threads" >"$out"
    log "wrote $out"
  fi
}

case "${1:-}" in
  build) shift; build "$@" ;;
  bindir) echo "$BUILD/bin" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
