#!/bin/bash
# Builds the vendored llama.cpp with CUDA on a machine with no GPU and no driver, and packs
# what scripts/gpu_device_run.sh expects into .gpu/ (docs/gpu.md, "How it ran"): the lent
# GPU machine then pays no build time. Needs CUDA 13.0's nvcc (/usr/local/cuda-13.0), pip,
# and the llama-cpp-python sdist that scripts/peer_speculative.sh unpacks. ~35 min on 2 cores
# for the libraries, ~15 more for `llama-server` (the peer in #32's GPU bench; SERVER=0
# leaves it out). ARCH (default 90, Hopper) picks the CUDA architecture.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${SRC:-$HOME/.cache/localspec/peer/llama_cpp_python-0.3.36}
CUDA_SRC=${CUDA_SRC:-/usr/local/cuda-13.0}
W=${WORK:-/tmp/gpu-build}
ARCH=${ARCH:-90}
SERVER=${SERVER:-1}
PY=${PY:-.venv/bin/python}
[ -d "$SRC/vendor/llama.cpp" ] || { echo "no llama.cpp sources in $SRC: run scripts/peer_speculative.sh first" >&2; exit 1; }
mkdir -p "$W" .gpu/whl

# cuBLAS from PyPI, laid into a copy of the toolkit (the image has nvcc but no cuBLAS)
if [ ! -e "$W/cuda/lib64/libcublas.so" ]; then
  rm -rf "$W/cuda" "$W/cublas" && cp -a "$CUDA_SRC" "$W/cuda"
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$W/cublas" nvidia-cublas==13.0.2.14
  (cd "$W/cublas" && unzip -q -o ./*.whl)
  lib=$(dirname "$(find "$W/cublas" -name 'libcublas.so.13*' | head -1)")
  inc=$(dirname "$(find "$W/cublas" -name 'cublas_v2.h' | head -1)")
  cp -a "$lib"/* "$W/cuda/lib64/" && cp -a "$inc"/* "$W/cuda/include/"
  (cd "$W/cuda/lib64" && ln -sf libcublas.so.13 libcublas.so && ln -sf libcublasLt.so.13 libcublasLt.so)
fi

# A stub driver with the functions ggml-cuda links (its virtual memory pool); the GPU
# machine's real libcuda.so.1 is found at run time.
syms=$(grep -rhoE '\bcu(Device|Mem|GetError)[A-Za-z0-9_]+\b' "$SRC/vendor/llama.cpp/ggml/src/ggml-cuda/" | sort -u)
for s in $syms; do echo "int $s(void) { return 999; }"; done >"$W/stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$W/cuda/lib64/libcuda.so" "$W/stub.c"
mkdir -p "$W/cuda/lib64/stubs" && cp "$W/cuda/lib64/libcuda.so" "$W/cuda/lib64/stubs/"
ln -sf libcuda.so "$W/cuda/lib64/stubs/libcuda.so.1"  # what llama-server's link looks for

on=$([ "$SERVER" = 1 ] && echo ON || echo OFF)
targets=(llama) && [ "$SERVER" = 1 ] && targets+=(llama-server)
cmake -S "$SRC/vendor/llama.cpp" -B "$W/cb" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_BUILD_COMMON=$on -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=$on \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=$on -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_COMPILER="$W/cuda/bin/nvcc" -DCUDAToolkit_ROOT="$W/cuda" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$W/cuda/lib64:$W/cuda/lib64/stubs" >"$W/configure.log"
cmake --build "$W/cb" --target "${targets[@]}" -j "$(nproc)" >"$W/build.log"

# What travels: the libraries, llama_cpp's Python package, the wheels the image lacks, the vocab
rm -rf .gpu/py && mkdir -p .gpu/py && cp -a "$SRC/llama_cpp" .gpu/py/
rm -rf "$W/pack" && mkdir -p "$W/pack" && cp -a "$W/cb/bin" "$W/pack/"
strip --strip-unneeded "$W"/pack/bin/*.so.* "$W"/pack/bin/llama-* 2>/dev/null || true
tar -cJf .gpu/lib.tar.xz -C "$W/pack" bin  # with the repository, under carry's 64 MiB
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .gpu/whl gguf==0.19.0 diskcache==5.6.3 platformdirs==4.14.8
# `localspec serve` and scripts/serve_bench.py (the openai SDK): what the image lacks, at
# this venv's versions (the image's own anyio, idna, typing-extensions are older)
pins=$("$PY" -m pip list --format=freeze 2>/dev/null | grep -iE '^(fastapi|starlette|uvicorn|pydantic|pydantic[-_]core|typing[-_]inspection|typing[-_]extensions|annotated[-_]types|annotated[-_]doc|opentelemetry-api|httptools|openai|jiter|sniffio|httpx2|httpcore2|truststore|anyio|idna|h11|certifi|click)==')
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/whl $pins
rm -f .gpu/ggml-vocab-qwen2.gguf && xz -9 -c "$SRC/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf" >.gpu/ggml-vocab-qwen2.gguf.xz
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >>.git/info/exclude
du -sh .gpu
