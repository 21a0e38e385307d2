#!/usr/bin/env bash
# GRPO on GSM8K with LoRA on Qwen2.5-7B-Instruct: one node, 8 x 80 GB GPUs, vLLM tensor parallel
# 2, rank-32 adapters on every projection, the base frozen in bf16, the adapters alone synced
# to a LoRA-enabled vLLM after the first sync. Settings: configs/qwen2_5_7b_lora_gsm8k_8gpu.yaml
# (the full fine-tuning preset qwen2_5_7b_gsm8k_8gpu.yaml with model.lora, sync.lora_mode and
# no offload). Predicted per-GPU memory, phase by phase:
#   python -m profiling.plan --config-name qwen2_5_7b_lora_gsm8k_8gpu --model Qwen2.5-7B --gpu-memory-gib 80
#   peak 49.38 GiB at rollout/generate (budget 78.50 GiB, margin +29.12 GiB): vLLM's 0.6 x 80 GiB
#   plus the actor (1.81 GiB: bf16 base shard + adapters) and its AdamW state (0.08 GiB), kept
#   on the device; trainer-side peak ref/forward 8.58 GiB, update/backward 8.46 GiB;
#   steady state: trainer 2.25 GiB, rollout 46.99 GiB; KV cache 37.50 GiB = 1,404,224 tokens
#   (one rollout needs 491,520 per engine); sync: 0.15 GiB of adapters (the first: the base).
# (The full output is in docs/memory.md.)
#
# MODEL is a local Hugging Face directory (no download happens here).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a local Qwen2.5-7B-Instruct directory}
DATA=${DATA:-outputs/data/gsm8k}
python examples/data/gsm8k.py --output-dir "$DATA"
exec python -m hybrid.main --config-name qwen2_5_7b_lora_gsm8k_8gpu \
  model.path="$MODEL" \
  data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" "$@"
