"""Where the bytes go: the per-phase memory ledger (ledger.py), the byte accounting of the
objects that hold them (components.py), the record format both write (records.py) and the
planner that predicts them from a config (planner.py: the phases and the fit; planner_sizes.py:
the bytes of each component and transient; reserve.py: what a CUDA process holds outside
torch's allocator, NCCL communicators included; host.py: host RAM per node)."""
