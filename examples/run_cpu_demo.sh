#!/usr/bin/env bash
# The main job on CPU: build the tiny model and the arithmetic task, then GRPO with the default
# config (configs/config.yaml). Extra arguments are Hydra overrides, e.g. trainer.total_steps=20.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
# `python -m hybrid.main` alone builds these two when they are missing (same functions, same
# bytes: hybrid/trainer/demo_assets.py); the script rebuilds them every time, so a changed
# generator always takes effect.
"$PYTHON" -m hybrid.models --output-dir outputs/demo/model --preset tiny --vocab arithmetic --seed 0
"$PYTHON" examples/data/arithmetic.py --output-dir outputs/demo/data --seed 0
# A fresh output directory per run (later arguments override it; point several runs at one
# directory to resume with trainer.resume=auto).
exec "$PYTHON" -m hybrid.main "trainer.output_dir=outputs/demo/run-$(date +%Y%m%d-%H%M%S)" "$@"
