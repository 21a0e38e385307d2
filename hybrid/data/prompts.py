"""Chat prompts to the left-padded tensors `generate_sequences` takes.

Output Batch: input_ids (b, prompt_length) left-padded with the pad id, attention_mask
(b, prompt_length), and the prompt text as the non-tensor `prompt`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hybrid.data.batch import Batch


def left_pad(token_lists: Sequence[Sequence[int]], prompt_length: int, pad_token_id: int) -> Batch:
    ids = torch.full((len(token_lists), prompt_length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(token_lists), prompt_length), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        if len(tokens) > prompt_length:
            raise ValueError(
                f"prompt row {row} has {len(tokens)} tokens, more than rollout.prompt_length={prompt_length}"
            )
        if tokens:
            ids[row, prompt_length - len(tokens) :] = torch.tensor(list(tokens))
            mask[row, prompt_length - len(tokens) :] = 1
    return Batch.from_dict({"input_ids": ids, "attention_mask": mask})


def chat_prompts(tokenizer: Any, texts: Sequence[str], prompt_length: int) -> Batch:
    """Apply the tokenizer's chat template to single-turn user messages and left-pad them."""
    token_lists = []
    for text in texts:
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        token_lists.append(tokenizer.encode(chat, add_special_tokens=False))
    batch = left_pad(token_lists, prompt_length, tokenizer.pad_token_id)
    return batch.union(Batch.from_dict({}, non_tensors={"prompt": list(texts)}))
