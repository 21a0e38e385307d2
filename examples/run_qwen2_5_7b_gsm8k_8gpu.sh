#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-7B-Instruct: one node, 8 x 80 GB GPUs, vLLM tensor parallel 2.
#
# Expected per-GPU memory (worked out from the sizes; not yet measured on this setup):
#   trainer mode: fp32 master shard 3.8 GB + fp32 grads 3.8 GB + bf16 all-gathered layer
#     buffers and activations (gradient checkpointing, 4 x 1.5k tokens per micro-batch) ~10 GB;
#     AdamW state (7.6 GB/GPU) lives on CPU between optimizer steps (actor.optimizer_offload);
#     vLLM asleep (weights offloaded, KV cache released): ~0 GB.
#   rollout mode: vLLM bf16 weights 7.6 GB (TP 2) + KV cache up to 0.6 x 80 GB - weights
#     ~40 GB; the actor's shards are parked on CPU (actor.param_offload), the reference too.
#   Peak ~50 GB of 80 GB, leaving room for the layer-by-layer gather (one layer, ~0.5 GB).
#
# MODEL is a local Hugging Face directory (no download happens here).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a local Qwen2.5-7B-Instruct directory}
DATA=${DATA:-outputs/data/gsm8k}
python examples/data/gsm8k.py --output-dir "$DATA"
exec python -m hybrid.main \
  model.path="$MODEL" model.attn_implementation=flash_attention_2 model.gradient_checkpointing=true \
  actor.lr=1e-6 actor.micro_batch_size=4 actor.param_offload=true actor.optimizer_offload=true \
  actor.use_kl_loss=true actor.kl_loss_coef=0.001 actor.kl_loss_type=low_var_kl \
  ref.param_offload=true ref.micro_batch_size=16 \
  rollout.tensor_parallel_size=2 rollout.n=5 rollout.temperature=1.0 \
  rollout.prompt_length=512 rollout.response_length=1024 rollout.max_model_len=1536 \
  rollout.gpu_memory_utilization=0.6 rollout.kv_cache_memory_bytes=null \
  data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" \
  data.max_prompt_length=512 data.train_batch_size=256 data.val_batch_size=512 \
  algorithm.ppo_mini_batch_size=64 \
  trainer.num_workers=8 trainer.use_gpu=true trainer.total_steps=300 trainer.save_freq=20 \
  trainer.test_freq=10 trainer.loggers="[console,jsonl,tensorboard]" \
  trainer.output_dir=outputs/qwen2_5_7b_gsm8k "$@"
