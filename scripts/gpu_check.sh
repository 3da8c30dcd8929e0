#!/usr/bin/env bash
# specdec on an NVIDIA GPU beside llama.cpp's own loops, in one go: build llama.cpp with CUDA (or take a prebuilt
# one), write a synthetic model pair at real proportions, find where a crash happens (diagnose), then run llama.cpp
# and specdec interleaved per prompt and print one table. Nothing is downloaded unless a source is missing.
#
# Needs: bash, CMake, Ninja, a C++ compiler (nvcc 13 for CUDA), xz; a Python with numpy, typer, rich, jinja2 and
# pyyaml. specdec runs from this checkout (not installed); llama_cpp (0.3.36 without lib/), gguf and diskcache come
# from GPU_CHECK_PYPATH [.gpu/py], the tokenizer from GPU_CHECK_VOCAB [.gpu/vocab.gguf]. Once, from the GPU kit:
#     mkdir -p .gpu && cp -r KIT/py KIT/vocab.gguf .gpu/        # .gpu/ is git-ignored
#
#   A GPU machine, from scratch (build ~250 s on 16 cores, then ~5 min):
#     GPU_CHECK_SRC=KIT/lcpp.tar.xz OUT=/tmp/gpu-check bash scripts/gpu_check.sh
#   A GPU machine with the libraries built elsewhere (same nvcc major version; ~5 min):
#     GPU_CHECK_BIN=.gpu/llama-cuda-sm90.tar.xz OUT=/tmp/gpu-check bash scripts/gpu_check.sh
#   A CPU machine with nvcc, to build and pack those libraries for sm_90 (no GPU needed; ~40 min on 2 cores):
#     GPU_CHECK_SRC=KIT/lcpp.tar.xz bash scripts/gpu_check.sh build-only    # -> .gpu/llama-cuda-sm90.tar.xz
#     GPU_CHECK_CONFIGURE_ONLY=1 bash scripts/gpu_check.sh build-only       # CMake's configure step alone
#   A CPU machine, the whole pipeline on tiny models (GPU_CHECK_QUANT=F16 where a -march=native build has AMX):
#     GPU_CHECK_CUDA=OFF bash scripts/gpu_check.sh                          # builds a CPU llama.cpp first
#     GPU_CHECK_BIN=/path/to/llama.cpp/build/bin bash scripts/gpu_check.sh  # or uses one (tools, libllama.so)
#   One phase alone, e.g. where the last run crashed: bash scripts/gpu_check.sh --diagnose (same knobs)
#
# Phases, in this order for `all` (the default); name one or more to run only those:
#   llama     build llama.cpp into .gpu/work/build-cuda (or -cpu), or unpack GPU_CHECK_BIN   (log: OUT/build.log)
#   models    random llama target (F16), quantized (GPU_CHECK_QUANT), early-exit draft cut from it, random EAGLE-3
#             and DFlash drafts of its proportions
#   diagnose  tiny steps, each in its own process, ok/CRASH each (scripts/gpu_diagnose.py; also: --diagnose)
#   bench     llama-completion, llama-speculative-simple (draft k, n-gram types) and specdec, per prompt
#   build-only  build (never GPU_CHECK_BIN), then pack; pack: the libraries and the three tools of the llama.cpp in
#               use in one .tar.xz (under 64 MiB for CUDA sm_90) to carry to a GPU machine as GPU_CHECK_BIN
#
# Knobs (environment):
#   OUT                  where logs, results.jsonl, table.txt go [.gpu/work/out]; logs.tar.gz holds them all at the end
#   GPU_CHECK_FEW_FILES=1  OUT keeps a handful of files: the per-run logs only inside logs.tar.gz
#   GPU_CHECK_WORK       sources, builds, models [.gpu/work]
#   GPU_CHECK_SRC        llama.cpp's source: a folder (llama.cpp, or llama-cpp-python's sdist), or a tarball of one
#                        [.gpu/src, else `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`]
#   GPU_CHECK_BIN        a built llama.cpp: a folder with llama-completion, llama-speculative-simple and libllama.so,
#                        or a .tar.xz/.tar.zst/.tar.gz of one (what build-only packs) [build from GPU_CHECK_SRC]
#   GPU_CHECK_PYPATH     a folder with the pure-Python llama_cpp (0.3.36, without lib/), gguf and diskcache [.gpu/py;
#                        empty: what the Python has installed]
#   GPU_CHECK_VOCAB      a GGUF holding Qwen2.5's tokenizer metadata [.gpu/vocab.gguf]
#   GPU_CHECK_PY         the Python [python3]                 GPU_CHECK_CUDA     ON or OFF (a CPU build) [ON]
#   GPU_CHECK_ARCH       CUDA architectures [90]               GPU_CHECK_J        build jobs [nproc]
#   GPU_CHECK_NATIVE     ON: -march=native [ON, OFF for build-only: the libraries run on another CPU]
#   GPU_CHECK_CUBLAS     a folder with lib/libcublas.so.13 and include/cublas_v2.h [the toolkit's, the Python's
#                        nvidia packages, else pip installs nvidia-cublas==13.0.2.14 into .gpu/cublas]
#   GPU_CHECK_CONFIGURE_ONLY=1  stop after CMake's configure    GPU_CHECK_PACK   the archive build-only writes
#   GPU_CHECK_TINY       1: 8 blocks x 256 stand-ins [1 where nvidia-smi lists no GPU, else 0: 28 x 1536]
#   GPU_CHECK_QUANT      Q4_K_M, Q8_0, ..., or F16 (as written) [Q4_K_M]   GPU_CHECK_MODELS   model folder
#   GPU_CHECK_N=256  GPU_CHECK_K=8  GPU_CHECK_NGL=99  GPU_CHECK_THREADS (-t for every tool)
#   GPU_CHECK_PROMPTS=explain,edit,general  GPU_CHECK_ONLY (bench run ids)  GPU_CHECK_BUDGET (s for the bench)
set -uo pipefail
export PYTHONUNBUFFERED=1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the checkout: specdec runs from it, not installed
W=${GPU_CHECK_WORK:-$ROOT/.gpu/work}
OUT=${OUT:-$W/out}
PY=${GPU_CHECK_PY:-python3}
LCPP_PIP=llama-cpp-python==0.3.36  # the llama.cpp that specdec's tested llama-cpp-python vendors
CUBLAS_PIP=nvidia-cublas==13.0.2.14  # CUDA 13.0's: libcublas.so.13 links against any later 13.x
mkdir -p "$OUT" "$W"
T0=$(date +%s)
TIMES=()
el() { echo $(($(date +%s) - T0)); }
say() { echo "== [$(el) s] $*"; }
die() { echo "error: $*" >&2; exit 1; }

# --- llama.cpp: sources, build, pack, or a prebuilt one ------------------------------------------------------------
# The llama.cpp source folder (with CMakeLists.txt and include/llama.h) in a folder or archive: the folder itself,
# its vendor/llama.cpp (llama-cpp-python's sdist), or one level down (a tarball's top folder).
lcpp_in() {
  local d
  for d in "$1" "$1/vendor/llama.cpp" "$1"/*/ "$1"/*/vendor/llama.cpp; do
    [ -f "$d/CMakeLists.txt" ] && [ -f "$d/include/llama.h" ] && { (cd "$d" && pwd); return 0; }
  done
  return 1
}

sources() {
  local src=${GPU_CHECK_SRC:-}
  if [ -z "$src" ]; then
    [ -d "$ROOT/.gpu/src" ] && src=$ROOT/.gpu/src
    [ -n "$src" ] || src=$(ls "$W"/sdist/llama_cpp_python-*.tar.gz 2>/dev/null | head -1)
  fi
  if [ -z "$src" ]; then
    echo "no GPU_CHECK_SRC: pip download $LCPP_PIP (source distribution)" >&2
    "$PY" -m pip download -q --no-deps --no-binary :all: "$LCPP_PIP" -d "$W/sdist" >&2 \
      || die "no llama.cpp source: set GPU_CHECK_SRC to llama-cpp-python's sdist or a llama.cpp folder/tarball"
    src=$(ls "$W"/sdist/llama_cpp_python-*.tar.gz | head -1)
  fi
  [ -e "$src" ] || die "GPU_CHECK_SRC=$src does not exist"
  if [ -d "$src" ]; then
    lcpp_in "$src" || die "no llama.cpp (CMakeLists.txt, include/llama.h) in $src"
    return
  fi
  # an archive: unpacked once into $W/src/NAME (the sdist's llama.cpp alone: it also holds a .git of 70 MB)
  local stamp="$src $(stat -c %s "$src")" dest=$W/src/$(basename "$src")
  if [ "$(cat "$dest.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$dest" && mkdir -p "$dest"
    echo "unpacking $src" >&2
    tar -xf "$src" -C "$dest" --wildcards --exclude='*/.git/*' '*llama.cpp/*' >&2 || die "cannot unpack $src"
    echo "$stamp" > "$dest.stamp"
  fi
  lcpp_in "$dest" || die "no llama.cpp (CMakeLists.txt, include/llama.h) in $src"
}

# cuBLAS: GPU_CHECK_CUBLAS, the toolkit's, the Python's nvidia packages (PyTorch's), .gpu/cublas, else (building,
# with a network) pip's. Sets CUBLAS_LIB (empty: the toolkit's, found by CMake) and puts it on LD_LIBRARY_PATH.
find_cublas() {
  local fetch=${1:-} root d lib
  CUBLAS_LIB=
  root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")")
  if [ -z "${GPU_CHECK_CUBLAS:-}" ]; then  # /usr/local/bin/nvcc may be a wrapper: the CUDA_HOME-style roots too
    for d in "$root" ${CUDA_HOME:-} /usr/local/cuda; do
      ls "$d"/lib64/libcublas.so* "$d"/targets/*/lib/libcublas.so* >/dev/null 2>&1 && { echo "cuBLAS: the toolkit's ($d)"; return 0; }
    done
  fi
  local dirs=(${GPU_CHECK_CUBLAS:-} $("$PY" -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null) "$ROOT/.gpu/cublas")
  for attempt in 1 2; do
    for d in "${dirs[@]}"; do
      [ -d "$d" ] || continue
      lib=$(find "$d" -maxdepth 5 -name 'libcublas.so.1[0-9]*' 2>/dev/null | sort | head -1)
      [ -n "$lib" ] && [ -f "$(dirname "$(dirname "$lib")")/include/cublas_v2.h" ] || continue
      CUBLAS_LIB=$(dirname "$lib")
      export LD_LIBRARY_PATH=$CUBLAS_LIB:${LD_LIBRARY_PATH:-}
      echo "cuBLAS: $CUBLAS_LIB"; return 0
    done
    [ -n "$fetch" ] && [ $attempt = 1 ] || break
    echo "cuBLAS: not found; pip install --target .gpu/cublas $CUBLAS_PIP"
    "$PY" -m pip install -q --no-deps --target "$ROOT/.gpu/cublas" "$CUBLAS_PIP" || break
  done
  echo "cuBLAS: NOT FOUND (set GPU_CHECK_CUBLAS)"; return 1
}

# CMake's arguments for CUDA beyond the defaults: cuBLAS where the toolkit lacks it (headers through a shim folder),
# and libcuda (the driver, for VMM): the toolkit's stub, the driver's own, else an empty stub named libcuda.so.1
# (its symbols resolve against the real driver where it runs: the tools' links allow that).
cuda_args() {
  local inc f root
  find_cublas fetch || return 1
  if [ -n "$CUBLAS_LIB" ]; then
    mkdir -p "$W/cublas-include"
    ln -sf "$(dirname "$CUBLAS_LIB")"/include/*.h "$W/cublas-include/"
    inc="-I$W/cublas-include"
    CMAKE_EXTRA+=("-DCUDA_cublas_LIBRARY=$(ls "$CUBLAS_LIB"/libcublas.so.1[0-9]* | head -1)"
                  "-DCUDA_cublasLt_LIBRARY=$(ls "$CUBLAS_LIB"/libcublasLt.so.1[0-9]* | head -1)"
                  "-DCMAKE_CXX_FLAGS=$inc")
    CUDA_FLAGS=$inc
  fi
  root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  f=$(ls "$root"/lib64/stubs/libcuda.so "$root"/targets/*/lib/stubs/libcuda.so /usr/lib/x86_64-linux-gnu/libcuda.so.1 \
         /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib64/libcuda.so.1 2>/dev/null | head -1)
  if [ -z "$f" ]; then
    mkdir -p "$W/cuda-stub"
    echo 'void ggml_gpu_check_stub(void) {}' | cc -shared -x c - -Wl,-soname,libcuda.so.1 -o "$W/cuda-stub/libcuda.so" \
      || return 1
    f=$W/cuda-stub/libcuda.so  # kept as a dependency although it defines nothing (the toolchain drops those)
    CMAKE_EXTRA+=("-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined" "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--no-as-needed")
  fi
  CMAKE_EXTRA+=("-DCUDA_cuda_driver_LIBRARY=$f")
  echo "libcuda: $f"
}

configure() {
  rm -rf "$B"
  cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_CCACHE=OFF \
    -DGGML_NATIVE="${NATIVE:-ON}" -DGGML_CUDA="${GPU_CHECK_CUDA:-ON}" -DCMAKE_CUDA_ARCHITECTURES="${GPU_CHECK_ARCH:-90}" \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF ${CUDA_FLAGS:+"-DCMAKE_CUDA_FLAGS=$CUDA_FLAGS"} "${CMAKE_EXTRA[@]}" \
    > "$OUT/build.log" 2>&1
}

build() {
  local cuda=${GPU_CHECK_CUDA:-ON}
  TAG=$([ "$cuda" = ON ] && echo cuda || echo cpu)
  B=$W/build-$TAG
  local cached
  cached=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$B/CMakeCache.txt" 2>/dev/null)  # an earlier build's source
  if [ -n "${GPU_CHECK_SRC:-}" ] || [ -z "$cached" ]; then SRC=$(sources) || exit 1; else SRC=$cached; fi
  [ "$SRC" = "$cached" ] || rm -f "$B/build.ninja"  # another source: configure again
  say "llama.cpp: $SRC -> $B (CUDA $cuda$([ -f "$B/build.ninja" ] || echo ", native ${NATIVE:-ON}"))"
  command -v nvcc >/dev/null && nvcc --version | tail -2 | head -1
  echo "$(cmake --version | head -1); ninja $(ninja --version); $(nproc) cores"
  CMAKE_EXTRA=() CUDA_FLAGS=
  if [ "$cuda" = ON ]; then cuda_args || die "no cuBLAS for the CUDA build"; fi
  if [ ! -f "$B/build.ninja" ] || [ -n "${GPU_CHECK_CONFIGURE_ONLY:-}" ]; then
    if ! configure; then
      grep -q "unsupported GNU version\|unsupported host compiler" "$OUT/build.log" \
        || { tail -30 "$OUT/build.log"; die "CMake's configure failed (OUT/build.log)"; }
      echo "nvcc refuses this host compiler: configuring again with -allow-unsupported-compiler"
      CUDA_FLAGS="$CUDA_FLAGS -allow-unsupported-compiler"
      configure || { tail -30 "$OUT/build.log"; die "CMake's configure failed (OUT/build.log)"; }
    fi
    grep -E "Found CUDAToolkit|CUDA_ARCHITECTURES|Including CUDA|CUDA Toolkit" "$OUT/build.log" | head -4
  fi
  if [ -n "${GPU_CHECK_CONFIGURE_ONLY:-}" ]; then
    local targets
    targets=$(ninja -C "$B" -t targets all 2>/dev/null)
    for t in llama llama-completion llama-speculative-simple llama-quantize ggml-cuda; do
      grep -q "^$t: " <<< "$targets" && echo "  target $t: present" || echo "  target $t: missing"
    done
    say "configured (GPU_CHECK_CONFIGURE_ONLY): stop"; exit 0
  fi
  cmake --build "$B" -j"${GPU_CHECK_J:-$(nproc)}" --target llama llama-completion llama-speculative-simple \
    llama-quantize >> "$OUT/build.log" 2>&1 &
  local pid=$!
  while kill -0 $pid 2>/dev/null; do  # progress every 30 s: ninja's [done/total]
    for _ in $(seq 30); do kill -0 $pid 2>/dev/null && sleep 1; done
    kill -0 $pid 2>/dev/null && echo "  [$(el) s] $(tail -c 3000 "$OUT/build.log" | grep -o '\[[0-9]*/[0-9]*\]' | tail -1)"
  done
  wait $pid || { tail -30 "$OUT/build.log"; die "the build failed (OUT/build.log)"; }
  BIN=$B/bin
  ls -laL "$BIN" | awk '$9 ~ /^(llama-completion|llama-speculative-simple|llama-quantize|lib(llama|ggml[a-z-]*)\.so)$/ {print "  " $5, $9}'
}

# The libraries and the three tools of $BIN, stripped, in one .tar.xz (GPU_CHECK_PACK), with a BUILD_INFO.
pack() {
  local name=llama-cpu stage mb
  [ -f "$BIN/libggml-vulkan.so" ] && name=llama-vulkan
  [ -f "$BIN/libggml-cuda.so" ] && name=llama-cuda-sm${GPU_CHECK_ARCH:-90}
  local archive=${GPU_CHECK_PACK:-$ROOT/.gpu/$name.tar.xz}
  stage=$W/pack/$name
  rm -rf "$W/pack" && mkdir -p "$stage/bin"
  cp -a "$BIN"/lib*.so* "$BIN"/llama-completion "$BIN"/llama-speculative-simple "$stage/bin/" || die "nothing to pack in $BIN"
  cp -a "$BIN"/llama-quantize "$stage/bin/" 2>/dev/null  # optional: gpu_models.py quantizes through the C API too
  find "$stage/bin" -type f -exec strip --strip-unneeded {} + 2>/dev/null
  { echo "llama.cpp from ${SRC:-$BIN}, packed $(date -u +%FT%TZ) on $(uname -m)"
    if [ "$name" != "${name#llama-cuda}" ]; then
      command -v nvcc >/dev/null && nvcc --version | tail -2 | head -1
      echo "CUDA architectures ${GPU_CHECK_ARCH:-90}, native ${NATIVE:-ON}"
      echo "needs at run time: libcudart.so.13 and libcublas.so.13 (on LD_LIBRARY_PATH), the driver's libcuda.so.1"
    fi
  } > "$stage/BUILD_INFO"
  say "packing $archive"
  XZ_OPT=${XZ_OPT:--9 -T0} tar -cJf "$archive" -C "$W/pack" "$name" || die "packing failed"
  mb=$(($(stat -c %s "$archive") / 1048576))
  echo "  $archive: $mb MiB$([ $mb -ge 64 ] && echo ' (over 64 MiB: too big to carry as one file)')"
}

# GPU_CHECK_BIN: a folder, or an archive unpacked once into $W/prebuilt; BIN = the folder with the tools.
prebuilt() {
  local p=$1 d
  if [ -f "$p" ]; then
    local stamp="$p $(stat -c %s "$p")"
    if [ "$(cat "$W/prebuilt.stamp" 2>/dev/null)" != "$stamp" ]; then
      rm -rf "$W/prebuilt" && mkdir -p "$W/prebuilt"
      tar -xf "$p" -C "$W/prebuilt" || die "cannot unpack $p"
      echo "$stamp" > "$W/prebuilt.stamp"
    fi
    p=$W/prebuilt
  fi
  d=$(dirname "$(find -L "$p" -maxdepth 3 -name llama-completion -type f | head -1)")
  [ -x "$d/llama-completion" ] && [ -f "$d/libllama.so" ] || die "no llama-completion and libllama.so in $1"
  BIN=$(cd "$d" && pwd)
  cat "$d/../BUILD_INFO" 2>/dev/null | sed 's/^/  /'
}

# Where llama.cpp's libraries are found at run time: the bin folder, cuBLAS, the toolkit's cudart.
runtime() {
  export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
  export LLAMA_CPP_LIB_PATH=$BIN
  if ls "$BIN"/libggml-cuda.so* >/dev/null 2>&1; then
    find_cublas || true
    local root
    root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")")
    [ -d "$root/lib64" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$root/lib64
  fi
  local pypath=${GPU_CHECK_PYPATH-$ROOT/.gpu/py}
  [ -z "$pypath" ] || [ -d "$pypath" ] || die "GPU_CHECK_PYPATH=$pypath: no such folder (llama_cpp, gguf, diskcache)"
  export PYTHONPATH=$ROOT${pypath:+:$pypath}${PYTHONPATH:+:$PYTHONPATH}
  "$PY" -c 'import specdec_cli.cli, gguf, numpy, llama_cpp, llama_cpp.llama_cpp as L
print("python ok: llama_cpp", llama_cpp.__version__, "from", llama_cpp.__path__[0] + ";", "library", L._lib._name + ";",
      "GPU offload:", bool(L.llama_supports_gpu_offload()))' || die "specdec or llama_cpp do not import (GPU_CHECK_PYPATH, GPU_CHECK_PY)"
}

# --- the model pair -----------------------------------------------------------------------------------------------
write_target() {  # $1: processes making tensors [every core]
  local vocab=${GPU_CHECK_VOCAB:-$ROOT/.gpu/vocab.gguf}
  [ -f "$vocab" ] || die "no vocabulary GGUF at $vocab (set GPU_CHECK_VOCAB)"
  [ -f "$M/target-F16.gguf" ] && return 0
  PYTHONPATH=${GPU_CHECK_PYPATH-$ROOT/.gpu/py}${PYTHONPATH:+:$PYTHONPATH} \
    "$PY" "$ROOT/scripts/gpu_models.py" write "$M/target-F16.gguf" --vocab "$vocab" --jobs "${1:-$(nproc)}" \
    $([ "$TINY" = 1 ] && echo --tiny)
}

models() {
  local q=${GPU_CHECK_QUANT:-Q4_K_M}
  say "models in $M ($([ "$TINY" = 1 ] && echo tiny || echo 1.5B-shaped), $q)"
  mkdir -p "$M"
  [ -n "${WRITER:-}" ] && { wait "$WRITER" || die "writing the F16 target failed (OUT/models.log)"; cat "$OUT/models.log"; }
  [ "$q" != F16 ] && [ -f "$M/target-$q.gguf" ] || write_target || die "writing the F16 target failed"
  T=$M/target-F16.gguf
  if [ "$q" != F16 ]; then
    T=$M/target-$q.gguf
    if [ ! -f "$T" ]; then
      if [ -x "$BIN/llama-quantize" ]; then
        "$BIN/llama-quantize" "$M/target-F16.gguf" "$T.part" "$q" > "$OUT/quantize.log" 2>&1 && mv "$T.part" "$T" \
          || { tail -20 "$OUT/quantize.log"; die "llama-quantize failed"; }
        grep -E "model size|quant size" "$OUT/quantize.log" | sed 's/^/  /'
      else  # a build without the tool: the same function through the C API
        "$PY" "$ROOT/scripts/gpu_models.py" quantize "$M/target-F16.gguf" "$T" "$q" > "$OUT/quantize.log" 2>&1 \
          || { tail -20 "$OUT/quantize.log"; die "quantizing failed"; }
        tail -1 "$OUT/quantize.log"
      fi
    fi
  fi
  D=$M/draft-$q.gguf
  [ -f "$D" ] || "$PY" "$ROOT/scripts/gpu_models.py" cut "$T" "$D" || die "cutting the draft failed"
  echo "  target $(du -h "$T" | cut -f1) $T; draft $(du -h "$D" | cut -f1) $D"
  for kind in eagle3 dflash; do  # random drafts of the target's proportions: a round's cost beside llama.cpp's
    [ -f "$M/$kind.gguf" ] || "$PY" "$ROOT/scripts/gpu_models.py" hidden "$T" "$M/$kind.gguf" --kind "$kind" \
      || die "writing the $kind draft failed"
  done
}

# --- main ---------------------------------------------------------------------------------------------------------
PHASES=("$@")
[ ${#PHASES[@]} -eq 0 ] && PHASES=(all)
[ "${PHASES[*]}" = all ] && PHASES=(llama models diagnose bench)
PHASES=("${PHASES[@]/--diagnose/diagnose}")
NATIVE=${GPU_CHECK_NATIVE:-}
[[ " ${PHASES[*]} " == *" build-only "* ]] && NATIVE=${NATIVE:-OFF}
if [ -z "${GPU_CHECK_TINY:-}" ]; then
  nvidia-smi -L 2>/dev/null | grep -q GPU && TINY=0 || TINY=1
else
  TINY=$GPU_CHECK_TINY
fi
M=${GPU_CHECK_MODELS:-$W/models-$([ "$TINY" = 1 ] && echo tiny || echo full)}
say "gpu_check ${PHASES[*]}: checkout $ROOT, work $W, OUT $OUT"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/  GPU: /'
"$PY" --version

# BIN for a phase that needs llama.cpp: the prebuilt one, or what an earlier run built.
need_bin() {
  [ -n "$BIN" ] && return 0
  if [ -n "${GPU_CHECK_BIN:-}" ]; then
    prebuilt "$GPU_CHECK_BIN"
  else
    BIN=$W/build-$([ "${GPU_CHECK_CUDA:-ON}" = ON ] && echo cuda || echo cpu)/bin
    [ -x "$BIN/llama-completion" ] || die "no llama.cpp at $BIN: run the llama phase first, or set GPU_CHECK_BIN"
  fi
}

BIN= READY= RC=0
for phase in "${PHASES[@]}"; do
  t=$(date +%s)
  case $phase in
    llama)
      if [ -n "${GPU_CHECK_BIN:-}" ]; then
        prebuilt "$GPU_CHECK_BIN"
      else
        if [ ! -f "$M/target-F16.gguf" ] && [ ! -f "$M/target-${GPU_CHECK_QUANT:-Q4_K_M}.gguf" ]; then
          # the F16 target, written meanwhile on two cores (numpy), niced below the build
          mkdir -p "$M"; (renice -n 10 -p $BASHPID > /dev/null; write_target 2 > "$OUT/models.log" 2>&1) & WRITER=$!
        fi
        build
      fi ;;
    build-only) build; pack ;;
    pack) need_bin; pack ;;
    models|diagnose|bench)
      need_bin
      [ -n "$READY" ] || { runtime; READY=1; }
      [ -n "${T:-}" ] || models
      if [ "$phase" = diagnose ]; then
        say "diagnose"
        "$PY" "$ROOT/scripts/gpu_diagnose.py" --target "$T" --draft "$D" --out "$OUT" --ngl "${GPU_CHECK_NGL:-99}" \
          ${GPU_CHECK_THREADS:+--threads $GPU_CHECK_THREADS} || RC=1
      elif [ "$phase" = bench ]; then
        say "bench"
        "$PY" "$ROOT/scripts/gpu_bench.py" --bin "$BIN" --target "$T" --draft "$D" --out "$OUT" \
          --eagle3 "$M/eagle3.gguf" --dflash "$M/dflash.gguf" \
          -n "${GPU_CHECK_N:-256}" -k "${GPU_CHECK_K:-8}" --ngl "${GPU_CHECK_NGL:-99}" \
          ${GPU_CHECK_THREADS:+--threads $GPU_CHECK_THREADS} ${GPU_CHECK_PROMPTS:+--prompts $GPU_CHECK_PROMPTS} \
          ${GPU_CHECK_ONLY:+--only $GPU_CHECK_ONLY} ${GPU_CHECK_BUDGET:+--budget $GPU_CHECK_BUDGET} || RC=1
      fi ;;
    *) die "unknown phase $phase (all, llama, models, diagnose, bench, build-only, pack)" ;;
  esac
  TIMES+=("$phase $(($(date +%s) - t)) s")
done
# every log in one file too: some ways of running this bring back only a few files (GPU_CHECK_FEW_FILES=1: only that)
(cd "$OUT" && ls -d logs diagnose 2>/dev/null | xargs -r tar -czf logs.tar.gz \
  && { [ -z "${GPU_CHECK_FEW_FILES:-}" ] || rm -rf logs diagnose; })
say "done: $(IFS=,; echo "${TIMES[*]}" | sed 's/,/, /g')$([ $RC = 0 ] || echo '; a step or run failed (above)')"
exit $RC
