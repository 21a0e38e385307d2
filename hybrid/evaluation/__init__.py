"""Evaluation: the estimators reasoning papers report over n samples per prompt (mean@n,
pass@k, best@k, maj@k, with confidence intervals over prompts: `estimators`, pure functions
that training's validation uses too) and the parts of `python -m hybrid.eval`
(docs/evaluation.md)."""
