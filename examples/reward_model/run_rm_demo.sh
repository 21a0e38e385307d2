#!/usr/bin/env bash
# The CPU demo (configs/config.yaml) rewarded by a tiny reward model alone: build the demo's model
# and task, train the reward model on its pairs if outputs/demo/rm is missing (about 1.5
# minutes), then GRPO with reward.model.combine=replace (the arithmetic rule reward still runs,
# for reward/rule_mean only). Extra arguments are Hydra overrides (docs/reward-models.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}
"$PYTHON" -m hybrid.models --output-dir outputs/demo/model --preset tiny --vocab arithmetic --seed 0
"$PYTHON" examples/data/arithmetic.py --output-dir outputs/demo/data --seed 0
if [ ! -f outputs/demo/rm/model.safetensors ]; then
  "$PYTHON" examples/reward_model/train_tiny_rm.py --output-dir outputs/demo/rm --data-dir outputs/demo/data
fi
exec "$PYTHON" -m hybrid.main reward.model.path=outputs/demo/rm reward.model.combine=replace \
  reward.model.micro_batch_size=32 "trainer.output_dir=outputs/demo/rm_run-$(date +%Y%m%d-%H%M%S)" "$@"
