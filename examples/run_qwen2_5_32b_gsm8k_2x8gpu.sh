#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-32B-Instruct on two nodes of 8 x 80 GB GPUs: 16 workers, vLLM
# tensor parallel 4 within each node, FSDP2 over all 16. Settings:
# configs/qwen2_5_32b_gsm8k_2x8gpu.yaml. Predicted per-GPU memory, phase by phase:
#   python -m profiling.plan --config-name qwen2_5_32b_gsm8k_2x8gpu --model Qwen2.5-32B --gpu-memory-gib 80
#   peak 51.30 GiB at rollout/generate (budget 78.50 GiB, margin +27.20 GiB); KV cache 33.44 GiB
#   = 547,808 tokens (one rollout needs 491,520 per engine); update/backward 43.44 GiB.
#
# First start the Ray cluster (docs/multi-node.md):
#   node 1:  ray start --head --port=6379 --num-gpus=8
#   node 2:  ray start --address=<node 1's IP>:6379 --num-gpus=8
# then run this script on node 1. MODEL must be a local Hugging Face directory and, like
# trainer.output_dir (checkpoints), a path that both nodes see (a shared file system).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a Qwen2.5-32B-Instruct directory both nodes can read}
DATA=${DATA:-outputs/data/gsm8k}
python examples/data/gsm8k.py --output-dir "$DATA"
exec python -m hybrid.main --config-name qwen2_5_32b_gsm8k_2x8gpu \
  model.path="$MODEL" \
  data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" "$@"
