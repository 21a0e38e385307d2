#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-7B-Instruct: one node, 8 x 80 GB GPUs, vLLM tensor parallel 2.
# Settings: configs/qwen2_5_7b_gsm8k_8gpu.yaml. Predicted per-GPU memory, phase by phase:
#   python -m profiling.plan --config-name qwen2_5_7b_gsm8k_8gpu --model Qwen2.5-7B --gpu-memory-gib 80
# (its output is in docs/memory.md).
#
# MODEL is a local Hugging Face directory (no download happens here).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a local Qwen2.5-7B-Instruct directory}
DATA=${DATA:-outputs/data/gsm8k}
python examples/data/gsm8k.py --output-dir "$DATA"
exec python -m hybrid.main --config-name qwen2_5_7b_gsm8k_8gpu \
  model.path="$MODEL" \
  data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" "$@"
