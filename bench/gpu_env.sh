# Sourced by the scripts that run on the GPU machine (bench/gpu_check.sh,
# bench/gpu_sanitize.sh): output folder, the pure-Python wheels the machine cannot
# download (.whl/, see README), the source tree on PYTHONPATH, and the CUDA build.
OUT=${OUT:-/tmp/qg_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# qg_build_gpu LOG: CUDA build of libquantgemm in build-gpu (archs QG_CUDA_ARCHS, default 90a)
qg_build_gpu() {
    { cmake -S . -B build-gpu -G Ninja -DQG_GPU=cuda -DCMAKE_BUILD_TYPE=Release \
          -DQG_CUDA_ARCHS="${QG_CUDA_ARCHS:-90a}" && cmake --build build-gpu -j16; } > "$1" 2>&1
}
