"""Where the bytes go, measured at run time: the per-phase memory ledger (ledger.py), the byte
accounting of the objects that hold them (components.py), the record format both write
(records.py) and a model's shape without its weights (model_shape.py, which the rollout
engine sizes its KV cache with). Workers import this package every step, so it imports no
config above it; the offline planner that predicts the same records from a run's config is
hybrid.planner."""
