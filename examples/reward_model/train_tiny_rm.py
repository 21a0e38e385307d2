"""Train a tiny reward model for the CPU demo's arithmetic task, then save it with its tokenizer.

    python examples/reward_model/train_tiny_rm.py --output-dir outputs/demo/rm

The model is the demo policy's family and size (the tiny Qwen2 of hybrid/models, arithmetic
vocabulary) with a one-label sequence-classification head (Qwen2ForSequenceClassification),
built from that config: nothing is downloaded. A row is rendered the way the trainer's reward
model member renders it (hybrid/workers/reward_inputs.py): the chat template over
[user: prompt, assistant: response].

It learns from a right and a wrong answer to each drawn prompt, labelled by the rule
(hybrid/rewards/arithmetic.py): right answers are the sum, alone or followed by characters the
rule ignores; wrong ones are another digit, alone or followed by what a right answer may carry
("8=2" for 5, so that the tail teaches nothing), the sum with a digit beside it ("77", "17"),
or any string of 0 to 4 characters (what the untrained demo policy says; its special tokens
decode to nothing, so "" occurs). The loss is binary cross-entropy on the score against
smoothed labels (`--label-smoothing` e), whose optimum puts every right answer at one score
and every wrong one at another, +-log((1 - e) / e): the score is calibrated (its sign is the
verdict, wrong answers sit close together) where a pairwise loss alone fixes only differences.
A Bradley-Terry term on each pair (`--pairwise-weight`) makes it learn faster.

It reports on the task's held-out split (<output-dir>/rm_eval.json): pointwise and pairwise
accuracy, the scores of right and wrong answers, and how often the best-scored answer among
every string of 0 to 3 characters is right. The task has only 25 distinct prompts (a, b < 5),
so held-out rows share prompts with training rows; what is held out is the answers drawn.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import Qwen2ForSequenceClassification

from hybrid.data import read_rows
from hybrid.data.arithmetic_task import write_arithmetic_task
from hybrid.models import TinyModelConfig, build_tokenizer, hf_config
from hybrid.models.tokenizer import save_tokenizer
from hybrid.rewards.arithmetic import compute_score

CHARACTERS = "0123456789+="
MAX_RESPONSE_CHARS = 4
"""The demo's rollout.response_length: one character per token."""

Example = tuple[str, str, float]
"""(prompt, response, label): label 1.0 when the rule scores the response right."""


def build_reward_model(output_dir: Path, seed: int) -> tuple[Any, Any]:
    """A fresh tiny sequence classifier (num_labels=1) and its tokenizer, saved to
    `output_dir`."""
    tiny = TinyModelConfig.preset("tiny", vocab="arithmetic", dtype="float32")
    config = hf_config(tiny)
    config.architectures = ["Qwen2ForSequenceClassification"]
    config.num_labels = 1
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(config)
    tokenizer = build_tokenizer(tiny.vocab, tiny.max_position_embeddings)
    output_dir.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tokenizer, output_dir)
    return model, tokenizer


def random_text(rng: random.Random, min_chars: int = 0) -> str:
    """`min_chars` to 4 characters of the vocabulary, each length equally likely."""
    length = rng.randint(min_chars, MAX_RESPONSE_CHARS)
    return "".join(rng.choice(CHARACTERS) for _ in range(length))


def wrong_answer(gold: str, rng: random.Random) -> str:
    """A response the rule scores 0, a quarter each: another digit; a right answer's shape
    with another digit ("8=2" for 5: so the characters after the number teach nothing); the
    sum with a digit next to it ("77", "17": the near misses); any string of 0 to 4
    characters (what an untrained policy says; its special tokens decode to nothing, so
    shorter strings and "" occur)."""
    while True:
        kind = rng.randrange(4)
        digit = str(rng.randrange(10))
        if kind == 0:
            answer = digit
        elif kind == 1:
            answer = right_answer(digit, rng)
        elif kind == 2:
            answer = (gold + digit if rng.random() < 0.5 else digit + gold) + random_text(rng)
        else:
            answer = random_text(rng)
        answer = answer[:MAX_RESPONSE_CHARS]
        if compute_score(answer, gold) == 0.0:
            return answer


def right_answer(gold: str, rng: random.Random) -> str:
    """A response the rule scores 1: half the time the sum alone, else the sum followed by
    characters that do not continue the number (the rule ignores them)."""
    if rng.random() < 0.5:
        return gold
    tail = rng.choice("+=") + random_text(rng)
    return (gold + tail)[:MAX_RESPONSE_CHARS]


def row_prompt(row: dict) -> tuple[str, str]:
    """(the user message, the gold answer) of a task row."""
    return row["prompt"][-1]["content"], str(row["reward_model"]["ground_truth"])


def examples(rows: list[dict], num_pairs: int, rng: random.Random) -> list[Example]:
    """A right and a wrong answer to each of `num_pairs` prompts drawn from `rows`: the
    rights first, then the wrongs in the same order."""
    drawn = [row_prompt(rng.choice(rows)) for _ in range(num_pairs)]
    rights = [(prompt, right_answer(gold, rng), 1.0) for prompt, gold in drawn]
    wrongs = [(prompt, wrong_answer(gold, rng), 0.0) for prompt, gold in drawn]
    return rights + wrongs


def encode(tokenizer: Any, prompt: str, response: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}],
        tokenize=False,
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def scores(model: Any, tokenizer: Any, prompts: list[str], responses: list[str]) -> torch.Tensor:
    """(b,) the model's score of each row (right-padded; the head reads the last real token)."""
    ids = [encode(tokenizer, p, r) for p, r in zip(prompts, responses, strict=True)]
    width = max(len(row) for row in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([row + [pad] * (width - len(row)) for row in ids])
    mask = (input_ids != pad).long()
    return model(input_ids=input_ids, attention_mask=mask).logits[:, 0]


def held_out_report(model: Any, tokenizer: Any, held_out: list[Example]) -> dict[str, float]:
    """On `examples`' layout (rights, then the wrongs of the same prompts): how often the
    score's sign agrees with the rule, how often the right answer of a pair scores above the
    wrong one, and the mean and spread of the scores of right and of wrong answers."""
    with torch.no_grad():
        found = scores(model, tokenizer, [e[0] for e in held_out], [e[1] for e in held_out])
    labels = torch.tensor([e[2] for e in held_out]).bool()
    right, wrong = found.chunk(2)
    return {
        "pointwise_accuracy": float(((found > 0) == labels).float().mean()),
        "pair_accuracy": float((right > wrong).float().mean()),
        "right_score_mean": float(right.mean()),
        "right_score_std": float(right.std()),
        "right_score_min": float(right.min()),
        "wrong_score_mean": float(wrong.mean()),
        "wrong_score_std": float(wrong.std()),
        "wrong_score_max": float(wrong.max()),
    }


def calibrated_loss(
    logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float, pairwise_weight: float
) -> torch.Tensor:
    """Binary cross-entropy of the scores against the smoothed labels, plus `pairwise_weight`
    x the Bradley-Terry loss of each (right, wrong) pair. logits, labels (2p,) on `examples`'
    layout: the first p rows right, the next p their wrong counterparts."""
    targets = labels * (1 - 2 * label_smoothing) + label_smoothing
    pointwise = F.binary_cross_entropy_with_logits(logits, targets)
    chosen, rejected = logits.chunk(2)
    return pointwise - pairwise_weight * F.logsigmoid(chosen - rejected).mean()


def best_answer_accuracy(model: Any, tokenizer: Any, rows: list[dict]) -> float:
    """Share of the distinct prompts of `rows` whose best-scored response, among every string
    of 0 to 3 characters of the vocabulary, is right: what a policy that maximises the score
    would answer, so a reward model that can be gamed scores low here."""
    candidates = ["".join(c) for n in range(4) for c in itertools.product(CHARACTERS, repeat=n)]
    prompts = dict(row_prompt(row) for row in rows)
    right = 0
    with torch.no_grad():
        for prompt, gold in prompts.items():
            found = scores(model, tokenizer, [prompt] * len(candidates), candidates)
            right += compute_score(candidates[int(found.argmax())], gold) == 1.0
    return right / len(prompts)


def train(model: Any, tokenizer: Any, rows: list[dict], args: argparse.Namespace) -> float:
    """AdamW at `args.lr` decayed to 0 on a cosine over `args.steps` steps; returns the
    seconds spent."""
    rng = random.Random(args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / args.steps))
    )
    started = time.perf_counter()
    model.train()
    for step in range(1, args.steps + 1):
        batch = examples(rows, args.batch_size, rng)
        logits = scores(model, tokenizer, [e[0] for e in batch], [e[1] for e in batch])
        labels = torch.tensor([e[2] for e in batch])
        loss = calibrated_loss(logits, labels, args.label_smoothing, args.pairwise_weight)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 100 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    model.eval()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/demo/rm"))
    parser.add_argument("--data-dir", type=Path, default=Path("outputs/demo/data"))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=64, help="prompts a step, 2 answers each")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak; cosine decay to 0")
    parser.add_argument("--label-smoothing", type=float, default=0.05)
    parser.add_argument("--pairwise-weight", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 0.0 < args.label_smoothing < 0.5:
        raise ValueError(f"--label-smoothing must be in (0, 0.5), got {args.label_smoothing}")
    torch.set_num_threads(1)  # steadier timings on a shared machine; the model is tiny
    if not (args.data_dir / "train.parquet").is_file():
        write_arithmetic_task(args.data_dir, seed=0)  # the demo's data, same bytes
    train_rows = read_rows(args.data_dir / "train.parquet")
    test_rows = read_rows(args.data_dir / "test.parquet")
    held_out = examples(test_rows, 500, random.Random(args.seed + 1))

    model, tokenizer = build_reward_model(args.output_dir, args.seed)
    before = held_out_report(model, tokenizer, held_out)
    seconds = train(model, tokenizer, train_rows, args)
    after = held_out_report(model, tokenizer, held_out)
    best = best_answer_accuracy(model, tokenizer, test_rows)
    model.save_pretrained(args.output_dir)
    target = math.log((1 - args.label_smoothing) / args.label_smoothing)
    report = {
        **after,
        "pointwise_accuracy_before": before["pointwise_accuracy"],
        "heldout_answers": float(len(held_out)),
        "best_answer_accuracy": best,
        "target_score": target,
        "train_steps": float(args.steps),
        "train_seconds": seconds,
    }
    (args.output_dir / "rm_eval.json").write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"held-out accuracy {before['pointwise_accuracy']:.3f} -> {after['pointwise_accuracy']:.3f}"
        f" ({len(held_out)} answers), pairwise {after['pair_accuracy']:.3f}; scores: right "
        f"{after['right_score_mean']:.2f} +- {after['right_score_std']:.2f}, wrong "
        f"{after['wrong_score_mean']:.2f} +- {after['wrong_score_std']:.2f} (optimum +-{target:.2f});"
        f" its best-scored answer is right for {best:.0%} of the prompts; "
        f"{args.steps} steps in {seconds:.0f} s; saved to {args.output_dir}"
    )
    return report


if __name__ == "__main__":
    main()
