"""The offline memory planner: will a run's config fit its GPUs and host RAM, predicted from
the config and the model's shape before anything starts.

plan.py places each component and transient in the phases of a step and judges the fit;
sizes.py weighs them for one worker (passes.py and adapters.py hold the shared micro-batch and
LoRA arithmetic; critic_sizes.py the PPO critic; teacher_sizes.py the distillation teacher);
reserve.py sizes what a CUDA process holds outside torch's allocator, NCCL communicators
included; host.py the host RAM per node; suggest.py searches the cheapest config changes that
make a run fit; longest.py the longest response a run fits, with and without sequence
parallelism; format.py prints a plan. The derivation of every term is docs/memory-model.md.

A top-floor package: it reads the whole run config (hybrid.trainer.config), and only the
entry points (the doctor, profiling.plan) import it; no worker-side module may."""
