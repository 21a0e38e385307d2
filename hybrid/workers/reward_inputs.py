"""What a reward model reads: the policy's rows as text, re-tokenized in the reward model's
own tokenizer, and packed or padded for its forward pass.

A row's text comes from the policy's tokens, decoded with the policy's tokenizer (special
tokens dropped): the response always; the prompt as the dataset's user message (`raw_prompt`)
when the batch carries it and the reward model's tokenizer has a chat template, which then
renders [user, assistant]. Without a chat template the text is the decoded prompt (as the
policy saw it) followed by the response. A row longer than `max_length` tokens keeps its last
`max_length`: the cut falls on the left, in the prompt, and the row is counted.

Shapes: b rows; packed input_ids / position_ids (1, T), padded (b, L); the score is read at
each row's last token (`score_index` (b,), in the flattened input).
"""

from __future__ import annotations

from typing import Any

import torch

from hybrid.data import Batch
from hybrid.workers.packing import ModelInputs, cu_seqlens


def prompt_texts(batch: Batch, tokenizer: Any) -> list[str]:
    """Each row's prompt tokens (attention-masked, so no padding) decoded by the policy's
    tokenizer."""
    t = batch.tensors
    width = t["input_ids"].shape[1] - t["responses"].shape[1]
    prompts, mask = t["input_ids"][:, :width], t["attention_mask"][:, :width].bool()
    return [
        tokenizer.decode(prompts[row][mask[row]].tolist(), skip_special_tokens=True)
        for row in range(len(batch))
    ]


def response_texts(batch: Batch, tokenizer: Any) -> list[str]:
    """Each row's response tokens decoded by the policy's tokenizer (special tokens, the end
    of turn among them, dropped: the reward model's template adds its own); an agent
    trajectory's tool replies are read too (the real tokens, not only the trained ones)."""
    responses = batch.tensors["responses"]
    mask = batch.tensors["attention_mask"][:, -responses.shape[1] :].bool()
    return [
        tokenizer.decode(responses[row][mask[row]].tolist(), skip_special_tokens=True)
        for row in range(len(batch))
    ]


def render_texts(batch: Batch, policy_tokenizer: Any, rm_tokenizer: Any) -> list[str]:
    """The text the reward model reads for each row (see the module docstring)."""
    responses = response_texts(batch, policy_tokenizer)
    if getattr(rm_tokenizer, "chat_template", None):
        if "raw_prompt" in batch.non_tensors:
            users = [str(text) for text in batch.non_tensors["raw_prompt"]]
        else:
            users = prompt_texts(batch, policy_tokenizer)
        return [
            rm_tokenizer.apply_chat_template(
                [{"role": "user", "content": user}, {"role": "assistant", "content": response}],
                tokenize=False,
            )
            for user, response in zip(users, responses, strict=True)
        ]
    prompts = prompt_texts(batch, policy_tokenizer)
    return [prompt + response for prompt, response in zip(prompts, responses, strict=True)]


def encode_texts(
    texts: list[str], tokenizer: Any, max_length: int, templated: bool
) -> tuple[list[list[int]], list[bool]]:
    """Token ids of each text (the last `max_length` of them) and whether it was cut.
    `templated`: the chat template already wrote the special tokens it wants, so the
    tokenizer adds none; plain text gets the tokenizer's own (e.g. a BOS)."""
    ids, truncated = [], []
    for text in texts:
        row = list(tokenizer.encode(text, add_special_tokens=not templated))
        if not row:
            raise ValueError(f"a row renders to no tokens for the reward model: {text!r:.80}")
        truncated.append(len(row) > max_length)
        ids.append(row[-max_length:])
    return ids, truncated


def _rows_read_at_their_last_token(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    last: torch.Tensor,
    lengths: torch.Tensor | None = None,
) -> ModelInputs:
    """The reward model's forward in the scoring passes' terms: one score per row, read at
    its last token (`score_index`), so packing, sequence parallelism and the gather are the
    critic's (hybrid.workers.value.head_scores)."""
    rows = last.numel()
    return ModelInputs(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        score_index=last,
        labels=torch.zeros_like(last),  # a head's scalar needs no label
        target=torch.arange(rows, device=last.device),
        response_shape=(rows, 1),
        cu_seqlens=None if lengths is None else cu_seqlens(lengths).to(last.device),
        max_seqlen=0 if lengths is None else int(lengths.max()),
    )


def packed(ids: list[list[int]], device: torch.device) -> ModelInputs:
    """The rows concatenated into one, positions restarting at 0 for each (the attention
    kernels keep each row to itself)."""
    lengths = torch.tensor([len(row) for row in ids])
    flat = [token for row in ids for token in row]
    positions = [p for row in ids for p in range(len(row))]
    return _rows_read_at_their_last_token(
        torch.tensor([flat], dtype=torch.long, device=device),
        torch.tensor([positions], dtype=torch.long, device=device),
        None,
        (lengths.cumsum(0) - 1).to(device),
        lengths,
    )


def padded(ids: list[list[int]], pad_token_id: int, device: torch.device) -> ModelInputs:
    """The rows right-padded to the longest, with an attention mask."""
    width = max(len(row) for row in ids)
    lengths = torch.tensor([len(row) for row in ids])
    rows = [row + [pad_token_id] * (width - len(row)) for row in ids]
    mask = (torch.arange(width) < lengths[:, None]).long()
    return _rows_read_at_their_last_token(
        torch.tensor(rows, dtype=torch.long, device=device),
        (mask.cumsum(-1) - 1).clamp(min=0).to(device),
        mask.to(device),
        (torch.arange(len(ids)) * width + lengths - 1).to(device),
    )
