"""`python -m hybrid.verl_compat [verl overrides]`: the command that takes the place of
`python3 -m verl.trainer.main_ppo` in a verl run script, the script otherwise unchanged.

It is `python -m hybrid.main`, which reads verl's names beside ours (docs/verl.md).
"""

from hybrid.main import cli

if __name__ == "__main__":
    cli()
