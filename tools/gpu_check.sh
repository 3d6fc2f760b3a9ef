#!/usr/bin/env bash
# Every GPU check in one call, for the lent GPU machine (no downloads there; torch, transformers, triton
# and accelerate are preinstalled). Writes its tables under $OUT (default ./gpu-check).
#   run:  bash tools/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
python -m pip install --quiet --no-deps -e . 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)" >> "$OUT/gpu.txt"

# 1. kernels and Medusa on CUDA (the kernel tests use CUDA tensors when a GPU is present)
timeout 300 python -m pytest -q tests/test_tree_kernels.py tests/test_trees.py tests/test_tree_acceptance.py \
    > "$OUT/pytest_cuda.txt" 2>&1
# 2. kernel vs reference micro-benchmark
timeout 300 python -m hf_spec.bench.tree_verify --device cuda --json "$OUT/tree_verify.json" \
    > "$OUT/tree_verify.txt" 2>&1
# 3. plain vs draft at 7B shape with controlled acceptance, measured against the cost model
timeout 420 hf-spec bench --synthetic llama-2-7b:tinyllama-1.1b --device cuda --dtype float16 --alpha 0.5,0.8 \
    --k 3,5,8 --modes vanilla,draft --limit 3 --max-new-tokens 128 --json "$OUT/synthetic.json" \
    > "$OUT/synthetic.txt" 2>&1
tail -n 3 "$OUT"/*.txt
