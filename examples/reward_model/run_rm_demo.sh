#!/usr/bin/env bash
# The CPU demo (configs/config.yaml) rewarded by a tiny reward model alone: build the demo's model
# and task, train the reward model (about 1.5 minutes) if outputs/demo/rm holds none trained by
# the current recipe (its rm_eval.json reports pointwise_accuracy), then GRPO with
# reward.model.combine=replace (the arithmetic rule reward still runs, for reward/rule_mean
# only). algorithm.norm_adv_by_std=false (Dr.GRPO): dividing by a group's std turns the reward
# model's small noise among a group of wrong answers into full-size advantages, and the policy
# follows that noise instead of the rare right answer (docs/reward-models.md). Extra arguments
# are Hydra overrides.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}
"$PYTHON" -m hybrid.models --output-dir outputs/demo/model --preset tiny --vocab arithmetic --seed 0
"$PYTHON" examples/data/arithmetic.py --output-dir outputs/demo/data --seed 0
if ! grep -qs pointwise_accuracy outputs/demo/rm/rm_eval.json; then
  "$PYTHON" examples/reward_model/train_tiny_rm.py --output-dir outputs/demo/rm --data-dir outputs/demo/data
fi
exec "$PYTHON" -m hybrid.main reward.model.path=outputs/demo/rm reward.model.combine=replace \
  algorithm.norm_adv_by_std=false reward.model.micro_batch_size=32 \
  "trainer.output_dir=outputs/demo/rm_run-$(date +%Y%m%d-%H%M%S)" "$@"
