#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-7B-Instruct, split placement on one node of 8 GPUs: 4 explorer
# workers (vLLM only, tensor parallel 2) generate while 4 trainer workers (FSDP2 actor +
# reference) train; weights go from trainer rank 0 to the explorers by NCCL broadcast, one
# step off (generation of step k+1 overlaps the update of step k; every trained token lags
# at most one version). The broadcast moves buckets of sync.bucket_mb (in the engine's dtype)
# from rank 0's GPU straight into receive buffers on each explorer GPU (two buckets of memory
# on each side), never through host memory; sync.verify_checksum=true adds a host copy of
# each bucket on both sides to hash it.
# Settings: configs/qwen2_5_7b_gsm8k_8gpu.yaml plus the overrides below (docs/modes.md). Not yet run on a GPU: the CPU suite covers the same code with gloo in place of
# NCCL, and tests/gpu/test_nccl_transport.py checks the NCCL broadcast on 2 GPUs.
#
# MODEL is a local Hugging Face directory (no download happens here).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a local Qwen2.5-7B-Instruct directory}
DATA=${DATA:-outputs/data/gsm8k}
python examples/data/gsm8k.py --output-dir "$DATA"
exec python -m hybrid.main --config-name qwen2_5_7b_gsm8k_8gpu \
  model.path="$MODEL" \
  data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" \
  trainer.mode=split trainer.num_explorer_workers=4 trainer.num_trainer_workers=4 \
  rollout.gpu_memory_utilization=0.85 trainer.val_before_train=false \
  actor.offload.param_offload=false actor.offload.optimizer_offload=false \
  ref.offload.param_offload=false \
  sync.method=nccl sync.style=fixed sync.interval=1 sync.offset=1 sync.max_staleness=1 \
  trainer.output_dir=outputs/qwen2_5_7b_gsm8k_split "$@"
