"""The WorkerDict members: the actor with its rollout engine (actor_rollout.py), and the
reference policy (ref.py); their configs (config.py) import nothing heavy, so the trainer's
config and the memory planner can be loaded without torch.distributed or vLLM.
"""
