#!/usr/bin/env bash
# The checks of a session lent a GPU (the device tool's machine), in one call, from the
# repository's root:
#
#     bash benchmarks/gpu_session.sh OUTDIR
#
# Before, here: the project's wheel and those of array-api-compat, array-api-extra,
# array-api-strict, dask, partd and locket in .whl/ (the machine has no network; see
# benchmarks/README.md). On the machine: installs them, then (1) benchmarks/gpu_bench.py:
# exactness and speed of masks on CuPy and torch CUDA against torch's own, (2)
# benchmarks/gpu_llama_sparsegpt.py: the command line's SparseGPT on a 1.1 B-parameter
# Llama with --device cuda, (3) the suite's CuPy, JAX and CUDA cases. Each step has its
# own time limit (BENCH_S, LLAMA_S, TESTS_S); OUTDIR gets the results and session.log.
# Python runs from /tmp: the checkout's arrayprune/ (the core without its adapters)
# must not shadow the installed package.
set -u
repo=$(pwd)
out=$(cd "${1:?OUTDIR}" && pwd)
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$repo${PYTHONPATH:+:$PYTHONPATH}
cd /tmp || exit 1
{
    echo "== environment"; date; nvidia-smi -L
    python3 -c "import torch, cupy, jax, onnxruntime, transformers, arrayprune.adapters; print('torch', torch.__version__, torch.version.cuda, '| cupy', cupy.__version__, '| jax', jax.__version__, jax.devices(), '| onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers(), '| transformers', transformers.__version__, '| arrayprune', arrayprune.__file__)"
    echo "== gpu_bench"; timeout "${BENCH_S:-150}" python3 "$repo/benchmarks/gpu_bench.py" "$out"; echo "exit $?"
    echo "== gpu_llama_sparsegpt"; timeout "${LLAMA_S:-150}" python3 -m benchmarks.gpu_llama_sparsegpt "$out"; echo "exit $?"
    echo "== pytest: CuPy, JAX and CUDA cases"
    timeout "${TESTS_S:-180}" python3 -m pytest -q -p no:cacheprovider --runslow --maxfail=30 \
        --continue-on-collection-errors -k "cupy or jax or cuda or agreement" -W ignore "$repo/tests" 2>&1 | tail -60
    echo "exit ${PIPESTATUS[0]}"
    date
} >"$out/session.log" 2>&1
tail -80 "$out/session.log"
