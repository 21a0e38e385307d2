"""Entry point: `python -m hybrid.main [overrides]` (console script `hybrid-train`).

The overrides may be in our names, verl's (`actor_rollout_ref.actor.optim.lr=1e-6`), or both:
verl's are translated first (hybrid/verl/, docs/verl.md), every one without a counterpart
named at once before anything starts. `--explain` prints the translation and the resolved
config and exits. `python -m hybrid.verl_compat` is the same command under verl's role.

Hydra composes configs/config.yaml (over the dataclasses' defaults, the registered `schema`)
with the command-line overrides; the result is converted once into the typed tree
(hybrid.trainer.config) and validated before any worker starts.
With the default model and data paths missing (a fresh checkout), the demo's tiny model and
arithmetic task are built first (hybrid/trainer/demo_assets.py).
The console shows a summary, a progress bar and a metrics line every trainer.log_freq steps;
vLLM, Ray and library logs go to <output_dir>/logs/ unless trainer.verbose=true
(hybrid/trainer/console.py).
"""

from __future__ import annotations

import sys
import time
from typing import NoReturn

import hydra
from omegaconf import DictConfig

from hybrid.controller.errors import StallError
from hybrid.heap import freeze_heap
from hybrid.rewards.manager import RewardError
from hybrid.trainer.compose import CONFIG_DIR as CONFIG_PATH
from hybrid.trainer.compose import register_schema, to_run_config
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.console import (
    INPUT_ERRORS,
    configure_logging,
    final_summary,
    print_lines,
    run_log_dir,
)
from hybrid.trainer.console import stop as stop_with
from hybrid.trainer.demo_assets import build_missing_demo_assets, demo_notice
from hybrid.trainer.loop import Driver
from hybrid.verl.resolve import apply as settle_verl_names
from hybrid.verl.translate import Translation, translate

TRANSLATION = Translation()
"""The command line's translation (`cli`): what Hydra composed still needs from it."""


def build_config(cfg: DictConfig) -> TrainerRunConfig:
    print_lines(settle_verl_names(TRANSLATION, cfg))
    config = to_run_config(cfg)
    # A fresh checkout has no outputs/demo: the default run builds its own model and data.
    built = build_missing_demo_assets(config)
    if built:
        print(demo_notice(built), flush=True)
    config.check_paths()
    return config


# Absolute: Hydra resolves a relative config_path as a package (`pkg://configs`) when the
# caller is imported rather than run as a file, which the console script hybrid-train does.
CONFIG_DIR = str(CONFIG_PATH)
# configs/config.yaml starts from the dataclasses' defaults: in Hydra's store before it composes.
register_schema()


def stop(error: BaseException, out: str | None, code: int) -> NoReturn:
    """One line instead of a traceback (hybrid.trainer.console.stop)."""
    stop_with("hybrid", error, out, code)


@hydra.main(version_base=None, config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        config = build_config(cfg)
    except INPUT_ERRORS as error:
        stop(error, None, 2)
    out, verbose = config.trainer.output_dir, config.trainer.verbose
    configure_logging(verbose, run_log_dir(out, verbose))
    started = time.monotonic()
    try:
        driver = Driver(config)  # every trainer.mode: hybrid/trainer/loop.py
    except INPUT_ERRORS as error:  # the tokenizer, the data rows, the reward file
        stop(error, out, 2)
    freeze_heap()  # the driver's imports and inputs live as long as the run
    try:
        final = driver.fit()
    except (RewardError, StallError) as error:  # the row, or the phase and ranks, named
        stop(error, out, 1)
    print_lines(final_summary(driver.reward_history, time.monotonic() - started, final, out))


VALUED_FLAGS: tuple[str, ...] = ("--cfg", "-c", "--config-name", "-cn", "--config-path", "-cp")
VALUED_FLAGS += ("--config-dir", "-cd", "--package", "-p")
"""Hydra's flags that take the next word as their value."""


def split_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """Hydra's flags (with their values) apart from the overrides."""
    flags: list[str] = []
    overrides: list[str] = []
    words = iter(args)
    for word in words:
        if word.startswith("-") and not word.startswith("~"):
            flags.append(word)
            if word in VALUED_FLAGS:
                flags.append(next(words, ""))
        else:
            overrides.append(word)
    return flags, overrides


def config_name(flags: list[str]) -> str:
    for i, flag in enumerate(flags):
        if flag in ("--config-name", "-cn"):
            return flags[i + 1]
        if flag.startswith("--config-name="):
            return flag.split("=", 1)[1]
    return "config"


def cli() -> None:
    """Translate verl's names, then run (or, with --explain, show what would run)."""
    global TRANSLATION
    flags, overrides = split_flags(sys.argv[1:])
    explain = "--explain" in flags
    flags = [flag for flag in flags if flag != "--explain"]
    translation = translate(overrides)
    try:
        translation.check()
        if explain:
            from hybrid.verl.explain import explain as show

            print_lines(show(translation, config_name(flags)))
            return
    except INPUT_ERRORS as error:
        stop(error, None, 2)
    sys.argv = [sys.argv[0], *flags, *translation.overrides]
    TRANSLATION = translation
    try:
        main()
    finally:  # a later in-process build_config starts from no translation
        TRANSLATION = Translation()


if __name__ == "__main__":
    cli()
