"""Pure tensor math of the RL objective: no Ray, no vLLM, no process groups."""
