"""`python -m hybrid.doctor`: can this config run on this machine, and if not, why?

facts.py gathers the machine once (versions, driver, GPUs, environment, Ray) into frozen
objects; diagnose.py turns config + facts + model shape into checks, a pure function (with
stack.py: versions, placement.py: GPUs and nodes, environment.py: NCCL / allocator
variables); compose.py composes the config and picks the model shape; output.py prints the
report and its JSON line; __main__.py is the command. Importing it imports neither vLLM
(versions come from importlib.metadata) nor starts Ray.
"""
