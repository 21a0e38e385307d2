#!/usr/bin/env bash
# TinyZero's Countdown recipe with PPO and a critic: Qwen2.5-3B (base) as actor and critic
# (the critic starts from the same checkpoint, its LM head replaced by a value head), GAE,
# the KL penalty in the reward with a fixed coefficient (no KL loss on the actor), one
# response per prompt, on one node with 8 GPUs (vLLM tensor parallel 1).
#
# Memory (`python -m profiling.plan --model Qwen2.5-3B <these overrides>`, per 80 GiB GPU):
# peak 33.9 GiB on 8 GPUs, 38.7 on 4, 45.9 on 2 (trainer.num_workers=N), at generation; the
# critic adds a second 3B model's fp32 shard, gradients and AdamW state to trainer mode,
# which is why both optimizers are offloaded between steps.
#
# MODEL is a local Hugging Face directory (no download happens here).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a local Qwen2.5-3B directory}
DATA=${DATA:-outputs/data/countdown}
python examples/data/countdown.py --output-dir "$DATA" --num-train 32768 --num-test 1024 --seed 0
exec python -m hybrid.main \
  model.path="$MODEL" model.attn_implementation=auto model.gradient_checkpointing=true \
  algorithm.adv_estimator=gae algorithm.gamma=1.0 algorithm.lam=1.0 \
  algorithm.use_kl_in_reward=true algorithm.kl_ctrl.type=fixed algorithm.kl_ctrl.kl_coef=0.001 \
  actor.optim.lr=1e-6 actor.micro_batch_size=8 actor.offload.optimizer_offload=true \
  actor.use_kl_loss=false \
  critic.optim.lr=1e-5 critic.micro_batch_size=8 critic.offload.optimizer_offload=true \
  critic.gradient_checkpointing=true trainer.critic_warmup=0 \
  rollout.tensor_parallel_size=1 rollout.n=1 rollout.temperature=1.0 \
  rollout.prompt_length=256 rollout.response_length=1024 rollout.max_model_len=1280 \
  rollout.gpu_memory_utilization=0.4 rollout.kv_cache_memory_bytes=null \
  data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" \
  data.max_prompt_length=256 data.train_batch_size=256 data.val_batch_size=1024 \
  algorithm.ppo_mini_batch_size=128 \
  trainer.num_workers=8 trainer.use_gpu=true trainer.total_steps=300 trainer.save_freq=50 \
  trainer.test_freq=10 trainer.loggers="[console,jsonl,tensorboard]" \
  trainer.output_dir=outputs/qwen2_5_3b_countdown_ppo "$@"
