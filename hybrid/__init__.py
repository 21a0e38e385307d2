"""hybrid: a colocated hybrid-engine RL trainer for LLMs.

One process per GPU (a Ray actor, the WorkerDict) hosts the FSDP2 training actor, the
reference policy and an in-process vLLM engine; the driver talks to them through worker-group
views. See README.md to start and docs/architecture.md for the layout and the data flow.
"""

__version__ = "0.1.0"
