#!/bin/bash
# benchmarks/gpu_check.sh: what a session lent a GPU runs there, in one call (docs/performance.md
# § GPU has the results). From the repository root, on a machine with a CUDA GPU, nvcc and
# PyTorch with CUDA:
#
#   bash benchmarks/gpu_check.sh [STAGE...]     stages: build kernels tests bench libs0 profile
#                                               host convs tiles variants sanitizer (default:
#                                               the first five)
#
# - build: the CUDA runtime library (make -C runtime/csrc cuda, every core)
# - kernels: runtime/csrc/tests/test_kernels_*.cu against it (make gpu-check)
# - tests: the cuda backend's pytest files with GRAPHC_TEST_ON_GPU=1 (tests/cuda_support.py),
#   so generated kernels are built by nvcc and run on the GPU, against the interpreter
# - bench: python -m benchmarks.gpu (graphc next to cuBLAS, cuDNN, PyTorch CUDA eager)
# - libs0: the SGEMM, conv and ResNet-18 rows again with GRAPHC_CUDA_LIBS=0 (graphc's own
#   kernels only, the ResNet-18 step profiled)
# - profile: the GPT and ResNet-18 steps again, with where their device time goes
# - host: python -m benchmarks.gpu_host (the GPT and ResNet-18 steps' host phases)
# - convs: python -m benchmarks.gpu_conv_shapes (ResNet-18's convolutions shape by shape)
# - tiles: the 128-row convolution tiles bounded for one block an SM (the default) against
#   two (GRAPHC_CUDA_TILE_BLOCKS=2, docs/backends.md), one process each: gpu_conv_shapes
#   with graphc's kernels only, then the ResNet-18 step
# - variants: benchmarks/cuda/elementwise_variants.cu, the elementwise chain written the ways
#   the generator could emit it, against a copy
# - sanitizer: the kernel test programs under compute-sanitizer memcheck and racecheck
# Each stage writes $OUT/<stage>.log (OUT defaults to /tmp/gpu_check) and prints its tail;
# STAGE_TIMEOUT_<stage> (seconds) bounds it.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export GRAPHC_CACHE_DIR=${GRAPHC_CACHE_DIR:-/tmp/graphc-gpu-cache}
CORES=$(nproc)
PY=${PYTHON:-python3}

stage() {  # stage NAME COMMAND...: runs it under its timeout, logs, prints the tail
    local name=$1 limit_var="STAGE_TIMEOUT_$1" start rc
    shift
    start=$(date +%s)
    echo "== $name: $*"
    timeout "${!limit_var:-300}" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc after $(( $(date +%s) - start )) s"
    tail -n "${TAIL_LINES:-12}" "$OUT/$name.log"
}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build kernels tests bench libs0)
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
      --format=csv; nvcc --version | tail -n 2
  $PY -c "import sys, numpy, llvmlite, torch; print(sys.version.split()[0], 'numpy',
numpy.__version__, 'llvmlite', llvmlite.__version__, 'torch', torch.__version__)"; } \
    > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
for s in "${stages[@]}"; do
    case $s in
        build) stage build make -C runtime/csrc -j"$CORES" cuda ;;
        kernels) stage kernels make -C runtime/csrc -j"$CORES" gpu-check ;;
        tests) stage tests env GRAPHC_TEST_ON_GPU=1 $PY -m pytest -q -n "${TEST_WORKERS:-12}" \
            -p no:cacheprovider tests/test_cuda_backend.py tests/test_cuda_gemm_conv.py \
            tests/test_cuda_parallel_reductions.py tests/test_cuda_determinism.py \
            tests/test_cuda_residency.py tests/test_models_cuda_emulated.py \
            tests/test_cuda_elementwise_items.py tests/test_cuda_async_calls.py \
            tests/test_cuda_launch_merging.py \
            "tests/test_models_transformer.py::test_gpt_step_on_emulated_cuda_matches_eager" ;;
        bench) stage bench $PY -m benchmarks.gpu --json "$OUT/bench.json" ;;
        libs0) stage libs0 env GRAPHC_CUDA_LIBS=0 $PY -m benchmarks.gpu --only sgemm_4096 \
            --only conv --only resnet18_b32 --profile --rounds 3 ;;
        profile) stage profile $PY -m benchmarks.gpu --only gpt_b16 --only resnet18_b32 \
            --profile --rounds 3 ;;
        host) stage host $PY -m benchmarks.gpu_host ;;
        convs) stage convs $PY -m benchmarks.gpu_conv_shapes ;;
        tiles) stage tiles bash -c "for blocks in 1 2; do
                echo \"== GRAPHC_CUDA_LIBS=0 GRAPHC_CUDA_TILE_BLOCKS=\$blocks\"
                GRAPHC_CUDA_LIBS=0 GRAPHC_CUDA_TILE_BLOCKS=\$blocks $PY -m benchmarks.gpu_conv_shapes \
                    --repeat 10; done
            for blocks in 1 2; do echo \"== GRAPHC_CUDA_TILE_BLOCKS=\$blocks\"
                GRAPHC_CUDA_TILE_BLOCKS=\$blocks $PY -m benchmarks.gpu --only resnet18_b32 --rounds 3
            done" ;;
        variants) stage variants bash -c "nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/variants \
            benchmarks/cuda/elementwise_variants.cu && /tmp/variants" ;;
        sanitizer) stage sanitizer make -C runtime/csrc gpu-check \
            GPU_RUNNER="compute-sanitizer --error-exitcode 1 --tool memcheck" ;;
        *) echo "gpu_check.sh: unknown stage '$s'" >&2; exit 2 ;;
    esac
done
