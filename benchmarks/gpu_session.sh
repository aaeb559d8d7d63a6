#!/usr/bin/env bash
# The checks of a session lent a GPU (the device tool's machine), in one call:
#
#     bash benchmarks/gpu_session.sh OUTDIR [--quick]
#
# Before, here: `pip wheel --no-deps --no-build-isolation -w .whl .` and the wheels of
# array-api-compat, array-api-extra, array-api-strict, dask, partd and locket in .whl/
# (the machine has no network; benchmarks/README.md says how). On the machine: installs
# them, then (1) benchmarks/gpu_bench.py: exactness and speed of masks on CuPy and torch
# CUDA against torch's own, (2) benchmarks/gpu_llama_sparsegpt.py: the command line's
# SparseGPT on a 1.1 B-parameter Llama with --device cuda, (3) the suite's CuPy, JAX and
# CUDA cases. Each step has its own time limit and log; OUTDIR gets the results.
set -u
out=${1:?OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
log="$out/session.log"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
{
    echo "== environment"; date; nvidia-smi -L
    python3 -c "import torch, cupy, jax, onnxruntime, transformers, arrayprune; print('torch', torch.__version__, torch.version.cuda, '| cupy', cupy.__version__, '| jax', jax.__version__, jax.devices(), '| onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers(), '| transformers', transformers.__version__, '| arrayprune', arrayprune.__file__)"
    echo "== gpu_bench"; timeout "${BENCH_S:-170}" python3 benchmarks/gpu_bench.py "$out" ${2:-}; echo "exit $?"
    echo "== gpu_llama_sparsegpt"; timeout "${LLAMA_S:-170}" python3 -m benchmarks.gpu_llama_sparsegpt "$out"; echo "exit $?"
    echo "== pytest: CuPy, JAX and CUDA cases"
    timeout "${TESTS_S:-200}" python3 -m pytest -q -p no:cacheprovider --runslow --maxfail=30 --continue-on-collection-errors \
        -k "cupy or jax or cuda or agreement" -W ignore tests 2>&1 | tail -40; echo "exit $?"
    date
} >"$log" 2>&1
tail -60 "$log"
