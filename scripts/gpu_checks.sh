#!/usr/bin/env bash
# What the GPU machine runs for dgl_maxk's evidence, in phases that fit one device call each.
#   [PRECISION=fp32|tf32|bf16] [FEATURES=device|host] bash scripts/gpu_checks.sh PHASE [OUT_DIR]
# PHASE: tests, kernels, compare, minibatch, papers-bench or papers-train
# Expects the wheels to install (torch, DGL, CuPy) in .whl/, carried to the machine.
set -uo pipefail
phase=${1:?phase: tests, kernels, compare, minibatch, papers-bench or papers-train}
out=${2:-${OUT:-runs/gpu}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 DGLBACKEND=pytorch NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
nvidia-smi -L
case $phase in
  tests)
    # the GPU tests and the core suites (the rest runs in CI); straight to the file, so a
    # timeout still leaves what ran
    python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py tests/test_edge_cases.py \
      tests/test_ops.py tests/test_layers.py tests/test_errors.py tests/test_models.py \
      tests/test_device_sampling.py tests/test_train.py tests/test_sampled_step.py \
      tests/test_large_graphs.py > "$out/tests.txt" 2>&1
    tail -n 15 "$out/tests.txt"
    # the same quickstart through the kernels and through the pure-torch path
    for backend in auto torch; do
      echo "== quickstart, DGL_MAXK_BACKEND=$backend" | tee -a "$out/tests.txt"
      DGL_MAXK_BACKEND=$backend python3 -m dgl_maxk train --config configs/quickstart.yaml \
        --device cuda --seeds 3 --out /tmp/quickstart-$backend --no-progress --quiet \
        >> "$out/tests.txt" 2>&1
      tail -n 4 "$out/tests.txt"
    done
    ;;
  kernels)
    # each kernel against cuSPARSE and against its floor; then the memory and race checkers
    python3 scripts/bench_kernels.py --graphs reddit --out "$out/kernels_reddit.json" \
      > "$out/kernels.log" 2>&1
    python3 scripts/bench_kernels.py --graphs products --reps 10 \
      --out "$out/kernels_products.json" >> "$out/kernels.log" 2>&1
    grep -A6 "^floors" "$out/kernels.log"
    python3 scripts/sanitize_kernels.py | tail -n 1
    if command -v compute-sanitizer > /dev/null; then
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        python3 scripts/sanitize_kernels.py > "$out/memcheck.txt" 2>&1; tail -n 2 "$out/memcheck.txt"
      compute-sanitizer --tool racecheck python3 scripts/sanitize_kernels.py \
        > "$out/racecheck.txt" 2>&1; tail -n 2 "$out/racecheck.txt"
    fi
    ;;
  compare)
    # BENCHMARKS.md's run (its compare.json is benchmarks/compare_h200.json): every arm under
    # the same precision (tf32: the paper's setting and the trainer's default)
    python3 scripts/compare_dgl.py --graphs reddit-sized products-sized medium \
      --models sage gcn gin --ks 8 32 --epochs 10 --warmup 3 \
      --precision "${PRECISION:-tf32}" --out "$out" 2>&1 | tee "$out/compare.log"
    ;;
  minibatch)
    echo "== torchrun, 2 GPUs: quickstart_minibatch" > "$out/minibatch.log"
    torchrun --nproc_per_node=2 -m dgl_maxk train --config configs/quickstart_minibatch.yaml \
      --device cuda --seeds 1 --set train.epochs=10 --out /tmp/qs-ddp --no-progress --quiet \
      >> "$out/minibatch.log" 2>&1
    tail -n 4 "$out/minibatch.log"
    # the graphed step (the default's choice in one process; on two GPUs with its
    # own all-reduce) and the eager one (DDP under torchrun) side by side
    python3 scripts/bench_minibatch.py --gpus 1 2 --breakdown --precision "${PRECISION:-tf32}" \
      --cuda-graph on off --out "$out" 2>&1 \
      | grep -v -i warn | tee -a "$out/minibatch.log"
    ;;
  papers-bench)
    # ogbn-papers100M's size on one GPU: the sampled step with the features in GPU memory
    # and in pinned host memory, a whole epoch each (1,179 steps), peak GPU memory per arm
    python3 scripts/bench_minibatch.py --graph papers100m-sized --gpus 1 --steps 2000 \
      --variants relu maxk-k32 --feature-memory device host --breakdown \
      --precision "${PRECISION:-tf32}" --out "$out" 2>&1 | grep -v -i warn \
      | tee "$out/papers_bench.log"
    ;;
  papers-train)
    # the config through the CLI: two epochs, then the layer-wise evaluation
    python3 -m dgl_maxk train --config configs/papers100m_sized_minibatch.yaml --device cuda \
      --out "$out/papers_runs" --no-progress ${FEATURES:+--set sampling.features=$FEATURES} \
      > "$out/papers_train.log" 2>&1
    tail -n 8 "$out/papers_train.log"
    ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
