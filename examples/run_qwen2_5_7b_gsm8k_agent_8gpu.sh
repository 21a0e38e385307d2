#!/usr/bin/env bash
# GRPO on GSM8K with tools: Qwen2.5-7B-Instruct, one node, 8 x 80 GB GPUs, vLLM tensor parallel
# 2. Each prompt is a trajectory of up to 4 model turns; the model's Hermes tool calls
# (<tool_call>{...}</tool_call>) run the built-in calculator and python tools and their results
# are appended as tokens before its next turn (docs/agents.md). Settings:
# configs/qwen2_5_7b_gsm8k_agent_8gpu.yaml (the plain preset qwen2_5_7b_gsm8k_8gpu.yaml with
# rollout.agent on, 2048 response tokens, 3072-token context). Predicted per-GPU memory:
#   python -m profiling.plan --config-name qwen2_5_7b_gsm8k_agent_8gpu --model Qwen2.5-7B --gpu-memory-gib 80
#   peak 47.49 GiB at rollout/generate (budget 74.50 GiB, margin +27.01 GiB); KV cache
#   36.65 GiB = 1,372,400 tokens (one rollout needs 983,040 per engine).
# The python tool runs each program in the sandbox (hybrid/sandbox/: time, memory and output
# limits, no network; docs/configuration.md, "Code tasks").
#
# MODEL is a local Hugging Face directory (no download happens here).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a local Qwen2.5-7B-Instruct directory}
DATA=${DATA:-outputs/data/gsm8k_tools}
python examples/data/gsm8k_tools.py --output-dir "$DATA"
exec python -m hybrid.main --config-name qwen2_5_7b_gsm8k_agent_8gpu \
  model.path="$MODEL" \
  data.train_files="[$DATA/train.parquet]" data.val_files="[$DATA/test.parquet]" "$@"
