#!/usr/bin/env bash
# GRPO on Geometry3K with Qwen2.5-VL-7B-Instruct: one node, 8 x 80 GB GPUs, vLLM tensor
# parallel 2; every prompt holds its figure (docs/vision.md). Settings:
# configs/qwen2_5_vl_7b_geo3k_8gpu.yaml. Predicted per-GPU memory, phase by phase:
#   python -m profiling.plan --config-name qwen2_5_vl_7b_geo3k_8gpu --model Qwen2.5-VL-7B --gpu-memory-gib 80
#
# MODEL is a local Hugging Face directory of Qwen2.5-VL-7B-Instruct (its image processor
# beside it); RAW is a local copy of the hiyouga/geometry3k dataset (no download happens here).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a local Qwen2.5-VL-7B-Instruct directory}
DATA=${DATA:-outputs/data/geo3k}
if [[ ! -f "$DATA/train.parquet" ]]; then
  RAW=${RAW:?set RAW to a local copy of the hiyouga/geometry3k dataset}
  python examples/data/geo3k.py --input-dir "$RAW" --output-dir "$DATA"
fi
exec python -m hybrid.main --config-name qwen2_5_vl_7b_geo3k_8gpu \
  model.path="$MODEL" \
  data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" "$@"
