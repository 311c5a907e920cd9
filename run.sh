#!/usr/bin/env bash
# Kiln launcher. Sets the machine up on first use (idempotent: a second run installs
# nothing), then:
#   ./run.sh                 start the web UI on http://127.0.0.1:7860
#   ./run.sh test [ARGS]     run the test suite (pytest ARGS)
#   ./run.sh example         run the CLI on a generated example image, print where the GLB went
#   ./run.sh kiln ARGS       any kiln command, e.g. ./run.sh kiln run photo.png -o out.glb
#   ./run.sh setup           only set up
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
TORCH_PIN="torch==2.14.1 torchvision==0.29.1"
mode="${1:-serve}"
case "$mode" in -*) mode=serve; set -- serve "$@" ;; esac

log() { printf '[run.sh] %s\n' "$*" >&2; }

need_debs() {
    # The CPU rasterizer needs EGL + Mesa's llvmpipe; browser tests need chromium; the
    # independent GLB renderer (three.js) and the Khronos glTF validator need node and npm.
    local pkgs="libegl1 libgl1-mesa-dri libegl-mesa0"
    [ "$mode" = test ] && pkgs="$pkgs chromium"
    local missing=""
    for p in $pkgs; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    if [ "$mode" = test ]; then
        command -v node >/dev/null || missing="$missing nodejs"
        command -v npm >/dev/null || missing="$missing npm"
    fi
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing Debian packages:$missing"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    else
        log "missing system packages:$missing"
        log "install them with: sudo apt-get install -y$missing"
        [ "$mode" = test ] || return 0
    fi
}

setup_python() {
    if [ ! -x "$PY" ]; then
        command -v python3 >/dev/null || { log "python3 (>= 3.10) is required"; exit 1; }
        python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
            || { log "python3 >= 3.10 is required, found $(python3 --version)"; exit 1; }
        log "creating $VENV"
        python3 -m venv "$VENV"
        "$PY" -m pip install -q --upgrade pip
    fi
    # A compatible torch already present is kept; otherwise the pinned pair (on local disk here).
    if ! "$PY" -c 'import torch, torchvision, sys; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(v < (2, 4))' 2>/dev/null; then
        log "installing $TORCH_PIN"
        "$PY" -m pip install -q $TORCH_PIN
    fi
    # Reinstall the project only when its dependency list changed.
    local stamp="$VENV/.kiln-installed"
    local want
    want=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        local extras="test"
        command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && extras="test,gpu"
        log "installing kiln3d[$extras] and its dependencies"
        "$PY" -m pip install -q -e ".[$extras]"
        echo "$want" > "$stamp"
    fi
    # the tests cover the Ray engine too (tests/test_ray_engine.py): its extra, for `test` only
    if [ "$mode" = test ] && ! "$PY" -c 'import ray' 2>/dev/null; then
        log "installing kiln3d[ray] (Ray, for the cluster engine's tests)"
        "$PY" -m pip install -q -e ".[ray]"
    fi
    # and --mask auto's rembg method (tests/test_rembg.py), where its Python is new enough
    if [ "$mode" = test ] && ! "$PY" -c 'import rembg' 2>/dev/null \
            && "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        log "installing kiln3d[rembg] (rembg + onnxruntime, for the rembg tests)"
        "$PY" -m pip install -q -e ".[rembg]"
    fi
    if ! "$PY" -c 'import sam2' 2>/dev/null; then
        log "installing sam2 1.1.0 (CPU build, no build isolation)"
        SAM2_BUILD_CUDA=0 "$PY" -m pip install -q --no-build-isolation sam2==1.1.0
    fi
    # The pipeline's numba kernels (pipeline/**/*_kernels.py), compiled into numba's cache
    # (about 10 s on two cores) whenever one of them changed, so that no job pays it.
    local kstamp="$VENV/.kiln-kernels"
    local kwant
    kwant=$(cat pipeline/*/*_kernels.py pipeline/*/*/*_kernels.py pipeline/kernels.py | sha256sum | cut -d' ' -f1)
    if [ ! -f "$kstamp" ] || [ "$(cat "$kstamp")" != "$kwant" ]; then
        log "compiling the pipeline's CPU kernels (numba, once per change)"
        "$PY" -m pipeline.kernels && echo "$kwant" > "$kstamp"
    fi
}

need_debs
setup_python
export PATH="$VENV/bin:$PATH"

case "$mode" in
    setup)
        log "set up; nothing else to do" ;;
    test)
        shift || true
        exec "$PY" -m pytest "$@" ;;
    example)
        mkdir -p var/examples var/out
        "$PY" -m kiln.examples var/examples
        "$PY" -m app.cli run var/examples/toy.png -o var/out/toy.glb
        log "GLB written to $ROOT/var/out/toy.glb" ;;
    kiln)
        shift
        exec "$PY" -m app.cli "$@" ;;
    serve)
        shift || true
        "$PY" -m app.cli doctor --summary || log "doctor found problems (run ./run.sh kiln doctor for details)"
        exec "$PY" -m app.cli serve "$@" ;;
    *)
        log "unknown command '$mode'; use: ./run.sh [serve|test|example|setup|kiln ARGS]"
        exit 2 ;;
esac
