#!/usr/bin/env bash
# GRPO on GSM8K with Qwen3-30B-A3B (instruct or base): one node, 8 x 80 GB GPUs, vLLM tensor parallel 2, router replay.
# Settings: configs/qwen3_30b_a3b_gsm8k_8gpu.yaml. Predicted per-GPU memory, phase by phase:
#   python -m profiling.plan --config-name qwen3_30b_a3b_gsm8k_8gpu --model Qwen3-30B-A3B --gpu-memory-gib 80
# (its output is in docs/moe.md).
#
# MODEL is a local Hugging Face directory (no download happens here).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a local Qwen3-30B-A3B (instruct or base) directory}
DATA=${DATA:-outputs/data/gsm8k}
python examples/data/gsm8k.py --output-dir "$DATA"
exec python -m hybrid.main --config-name qwen3_30b_a3b_gsm8k_8gpu \
  model.path="$MODEL" \
  data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" "$@"
