#!/usr/bin/env bash
# GRPO with 32k-token sequences (2,048-token prompts, 30,720-token responses) on
# Qwen2.5-7B-Instruct: one node, 8 x 80 GB GPUs, Ulysses sequence parallelism over 4 GPUs
# (actor.sp_size=4, docs/long-context.md), vLLM tensor parallel 2. Settings:
# configs/qwen2_5_7b_longctx_8gpu.yaml. Predicted per-GPU memory, phase by phase, and the
# longest response that fits with and without sp:
#   python -m profiling.plan --config-name qwen2_5_7b_longctx_8gpu --model Qwen2.5-7B --gpu-memory-gib 80 --longest
#   peak 59.90 GiB at rollout/generate (budget 72.50 GiB after a 7.50 GiB reserve, margin
#   +12.60 GiB), no offload needed; trainer-side peak update/backward 27.09 GiB (a rank's
#   8,192 tokens of one 32,768-token sequence); KV cache 1,372,400 tokens per engine (about 41
#   of its 64 sequences at once, the rest queue). (docs/memory.md, "Long context".)
#
# GSM8K is the stand-in data here: few of its responses reach the length this run allows;
# point DATA at prompt parquet files of a long-reasoning task in the same layout
# (examples/data/*.py) for runs that use it.
#
# MODEL is a local Hugging Face directory (no download happens here).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a local Qwen2.5-7B-Instruct directory}
DATA=${DATA:-outputs/data/gsm8k}
if [[ ! -f "$DATA/train.parquet" ]]; then
  python examples/data/gsm8k.py --output-dir "$DATA"
fi
exec python -m hybrid.main --config-name qwen2_5_7b_longctx_8gpu \
  model.path="$MODEL" \
  data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" "$@"
