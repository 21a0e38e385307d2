#!/usr/bin/env bash
# TinyZero's setup: Qwen2.5-3B (base) learns Countdown (reach a target with +-*/ using each
# number once) from a rule reward, on one node with 8 GPUs (vLLM tensor parallel 1).
#
# Expected per-GPU memory (worked out from the sizes; not yet measured): fp32 master shard
# 1.5 GB + grads 1.5 GB + AdamW 3 GB (on CPU between steps) + activations ~6 GB in trainer
# mode; vLLM bf16 weights 6.2 GB + KV cache up to 0.5 x 80 GB in rollout mode.
#
# MODEL is a local Hugging Face directory (no download happens here).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a local Qwen2.5-3B directory}
DATA=${DATA:-outputs/data/countdown}
python examples/data/countdown.py --output-dir "$DATA" --num-train 32768 --num-test 1024 --seed 0
exec python -m hybrid.main \
  model.path="$MODEL" model.attn_implementation=auto model.gradient_checkpointing=true \
  actor.optim.lr=1e-6 actor.micro_batch_size=8 actor.offload.optimizer_offload=true \
  actor.use_kl_loss=true actor.kl_loss_coef=0.001 \
  rollout.tensor_parallel_size=1 rollout.n=8 rollout.temperature=1.0 \
  rollout.prompt_length=256 rollout.response_length=1024 rollout.max_model_len=1280 \
  rollout.gpu_memory_utilization=0.5 rollout.kv_cache_memory_bytes=null \
  data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" \
  data.max_prompt_length=256 data.train_batch_size=256 data.val_batch_size=1024 \
  algorithm.ppo_mini_batch_size=128 \
  trainer.num_workers=8 trainer.use_gpu=true trainer.total_steps=300 trainer.save_freq=50 \
  trainer.test_freq=10 trainer.loggers="[console,jsonl,tensorboard]" \
  trainer.output_dir=outputs/qwen2_5_3b_countdown "$@"
