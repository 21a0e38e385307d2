"""Train a tiny reward model for the CPU demo's arithmetic task, then save it with its tokenizer.

    python examples/reward_model/train_tiny_rm.py --output-dir outputs/demo/rm

The model is the demo policy's family and size (the tiny Qwen2 of hybrid/models, arithmetic
vocabulary) with a one-label sequence-classification head (Qwen2ForSequenceClassification),
built from that config: nothing is downloaded. It learns from pairs made of the demo task's
prompts (hybrid/data/arithmetic_task.py): the correct answer against a perturbed one (another
digit, the right digit with another one after it, or a random string of the vocabulary), with
the Bradley-Terry loss -log sigmoid(r_chosen - r_rejected). A row is rendered the way the
trainer's reward model member renders it (hybrid/workers/reward_inputs.py): the chat template
over [user: prompt, assistant: response]. It reports the pairwise accuracy on pairs of the
task's held-out split and writes it to <output-dir>/rm_eval.json.

The task has only 25 distinct prompts (a, b < 5), so held-out pairs share prompts with training
pairs; what is held out is the pairing with freshly drawn wrong answers.
"""

from __future__ import annotations

import argparse
import itertools
import json
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


def random_text(rng: random.Random) -> str:
    """1 to 4 characters of the vocabulary: the length of the demo's responses."""
    return "".join(rng.choice(CHARACTERS) for _ in range(rng.randint(1, 4)))


def wrong_answer(gold: str, rng: random.Random) -> str:
    """A response the rule reward scores 0: half the time another single digit (the hard
    case), else any string of the vocabulary that is wrong (what an exploring policy says)."""
    while True:
        answer = str(rng.randrange(10)) if rng.random() < 0.5 else random_text(rng)
        if compute_score(answer, gold) == 0.0:
            return answer


def right_answer(gold: str, rng: random.Random) -> str:
    """A response the rule reward scores 1: half the time the sum alone, else the sum followed
    by characters that do not continue the number (the rule ignores them)."""
    if rng.random() < 0.5:
        return gold
    while True:
        answer = gold + rng.choice("+=") + random_text(rng)[: rng.randint(0, 2)]
        if compute_score(answer, gold) == 1.0:
            return answer


def pairs(rows: list[dict], count: int, rng: random.Random) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected) triples drawn from `rows`."""
    picked = [rng.choice(rows) for _ in range(count)]
    out = []
    for row in picked:
        gold = str(row["reward_model"]["ground_truth"])
        prompt = row["prompt"][-1]["content"]
        out.append((prompt, right_answer(gold, rng), wrong_answer(gold, rng)))
    return out


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


def accuracy(model: Any, tokenizer: Any, triples: list[tuple[str, str, str]]) -> float:
    """Share of pairs whose correct answer scores above the wrong one."""
    with torch.no_grad():
        prompts = [t[0] for t in triples]
        chosen = scores(model, tokenizer, prompts, [t[1] for t in triples])
        rejected = scores(model, tokenizer, prompts, [t[2] for t in triples])
    return float((chosen > rejected).float().mean())


def best_answer_accuracy(model: Any, tokenizer: Any, rows: list[dict]) -> float:
    """Share of the distinct prompts of `rows` whose best-scored response, among every string
    of 1 to 3 characters of the vocabulary, is right: what a policy that maximises the score
    would answer, so a reward model that can be gamed scores low here."""
    candidates = ["".join(c) for n in (1, 2, 3) for c in itertools.product(CHARACTERS, repeat=n)]
    prompts = {row["prompt"][-1]["content"]: str(row["reward_model"]["ground_truth"]) for row in rows}
    right = 0
    with torch.no_grad():
        for prompt, gold in prompts.items():
            found = scores(model, tokenizer, [prompt] * len(candidates), candidates)
            right += compute_score(candidates[int(found.argmax())], gold) == 1.0
    return right / len(prompts)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/demo/rm"))
    parser.add_argument("--data-dir", type=Path, default=Path("outputs/demo/data"))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # steadier timings on a shared machine; the model is tiny
    if not (args.data_dir / "train.parquet").is_file():
        write_arithmetic_task(args.data_dir, seed=0)  # the demo's data, same bytes
    train_rows = read_rows(args.data_dir / "train.parquet")
    test_rows = read_rows(args.data_dir / "test.parquet")
    rng = random.Random(args.seed)
    held_out = pairs(test_rows, 500, random.Random(args.seed + 1))

    model, tokenizer = build_reward_model(args.output_dir, args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    before = accuracy(model, tokenizer, held_out)
    started = time.perf_counter()
    model.train()
    for step in range(1, args.steps + 1):
        batch = pairs(train_rows, args.batch_size, rng)
        prompts = [t[0] for t in batch]
        chosen = scores(model, tokenizer, prompts, [t[1] for t in batch])
        rejected = scores(model, tokenizer, prompts, [t[2] for t in batch])
        loss = -F.logsigmoid(chosen - rejected).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    seconds = time.perf_counter() - started
    model.eval()
    after = accuracy(model, tokenizer, held_out)
    best = best_answer_accuracy(model, tokenizer, test_rows)
    model.save_pretrained(args.output_dir)
    report = {
        "heldout_pair_accuracy_before": before,
        "heldout_pair_accuracy": after,
        "heldout_pairs": float(len(held_out)),
        "best_answer_accuracy": best,
        "train_steps": float(args.steps),
        "train_seconds": seconds,
    }
    (args.output_dir / "rm_eval.json").write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"held-out pairwise accuracy {before:.3f} -> {after:.3f} ({len(held_out)} pairs); "
        f"its best-scored answer is right for {best:.0%} of the prompts; "
        f"{args.steps} steps in {seconds:.0f} s; saved to {args.output_dir}"
    )
    return report


if __name__ == "__main__":
    main()
