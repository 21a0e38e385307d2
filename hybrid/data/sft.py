"""SFT files on disk to tokenized rows with a loss mask: `SftDataset`.

Two row layouts, parquet or jsonl (read by `read_rows`), told apart by their keys:
  (a) `{"prompt": [chat messages], "response": "..."}`: our prompt layout plus the target;
  (b) `{"messages": [chat messages]}`: a conversation whose every assistant message is a target.

Rendering follows `PromptDataset` (hybrid/data/dataset.py) to the token: the prompt is the chat
template of the messages before the first target with the generation prompt, encoded without
special tokens, so the model learns to answer the prompts RL will show it. A target is its
content's tokens plus EOS (loss mask 1). Layout (b) is rendered incrementally: before each
assistant message the template of the conversation so far with the generation prompt; the
text it adds since the last target (the other roles' turns, the turn markers) is context, with
loss mask 0. The template's own end of the assistant turn, when it is the EOS token, is the
target's EOS; messages after the last assistant message are dropped (nothing to learn there).
Templates that rewrite earlier turns (so that the conversation so far is no prefix of the
next rendering) are refused, naming the row.

A row longer than `max_length` tokens raises naming the file, the row and its length, or with
`truncation="right"` loses its last tokens; truncated rows are listed (`truncated_rows`) and
logged in one warning, never silent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hybrid.data.dataset import check_messages, read_rows

logger = logging.getLogger(__name__)

NUM_LOGGED_ROWS = 5
"""How many truncated rows the truncation warning lists."""


@dataclass(frozen=True)
class SftRow:
    """One tokenized SFT row: a prompt, then everything after it with its loss mask."""

    prompt_ids: list[int]
    """The chat-templated prompt with the generation prompt appended."""
    response_ids: list[int]
    """The tokens after the prompt: targets (each ending in EOS) and, in layout (b), the
    context between them."""
    loss_mask: list[int]
    """Per response token: 1 on a target's tokens, 0 on context."""
    source: str
    """Where the row came from, as "file:row"."""
    truncated: bool = False
    """Its last tokens were cut at max_length."""


class ChatRenderer:
    """The tokenizer's chat template and encoder, with the checks every segment gets."""

    def __init__(self, tokenizer: Any) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos_token_id; every SFT target ends in EOS")
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad_token_id; SFT batches are padded")
        self.tokenizer = tokenizer
        self.eos_id: int = tokenizer.eos_token_id
        self.eos_text: str = tokenizer.eos_token

    def template(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        text: str = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False
        )
        return text

    def encode(self, text: str, where: str, what: str) -> list[int]:
        """The tokens of `text`; a vocabulary that cannot encode a character of it (the small
        ones drop them) refuses the row rather than train on a text that lost it."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        decoded = self.tokenizer.decode(ids, skip_special_tokens=False)
        if decoded != text:
            lost = sorted(set(text) - set(decoded))
            raise ValueError(
                f"{where}: the {what} has characters the tokenizer cannot encode: {lost}; use "
                "a tokenizer whose vocabulary covers them"
            )
        return ids


def _prompt_response_row(
    raw: Mapping[str, Any], render: ChatRenderer, where: str
) -> tuple[list[int], list[int], list[int]]:
    """Layout (a): (prompt ids, response ids, loss mask)."""
    messages = check_messages(raw["prompt"], "prompt", where)
    response = raw.get("response")
    if not isinstance(response, str) or not response:
        raise ValueError(
            f"{where}: field 'response' is missing or not a non-empty str (a row in the "
            f"prompt layout needs its target), got {response!r:.80}"
        )
    prompt = render.encode(render.template(messages, True), where, "prompt")
    target = [*render.encode(response, where, "response"), render.eos_id]
    return prompt, target, [1] * len(target)


def _conversation_row(
    raw: Mapping[str, Any], render: ChatRenderer, where: str
) -> tuple[list[int], list[int], list[int]]:
    """Layout (b): (prompt ids, response ids, loss mask), rendered turn by turn."""
    messages = check_messages(raw["messages"], "messages", where)
    targets = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not targets:
        raise ValueError(f"{where}: field 'messages' has no assistant message (no target)")
    if targets[0] == 0:
        raise ValueError(
            f"{where}: field 'messages' starts with an assistant message; the first target "
            "needs a message before it (the prompt)"
        )
    covered = render.template(messages[: targets[0]], True)
    prompt = render.encode(covered, where, "prompt")
    response: list[int] = []
    mask: list[int] = []
    for index in targets:
        content = messages[index]["content"]
        if not content:
            raise ValueError(f"{where}: field 'messages' message {index} is an empty target")
        before = render.template(messages[:index], True)
        turn = render.template(messages[: index + 1], False)
        if not before.startswith(covered) or not turn.startswith(before + content):
            raise ValueError(
                f"{where}: the chat template does not render message {index} after the "
                "conversation before it (it rewrites earlier turns); such a template cannot be "
                "split into context and targets"
            )
        if len(before) > len(covered):
            context = render.encode(before[len(covered) :], where, f"text before message {index}")
            response += context
            mask += [0] * len(context)
        target = [*render.encode(content, where, f"message {index}"), render.eos_id]
        response += target
        mask += [1] * len(target)
        # The template's own end of the turn, when it is EOS, is the target's EOS token.
        ends_in_eos = turn[len(before) + len(content) :].startswith(render.eos_text)
        covered = before + content + (render.eos_text if ends_in_eos else "")
    return prompt, response, mask


def tokenize_row(raw: Mapping[str, Any], render: ChatRenderer, path: Path, index: int) -> SftRow:
    """Row `index` of the file at `path`, in either layout, untruncated."""
    where = f"{path}: row {index}"
    has_messages = raw.get("messages") is not None
    has_prompt = raw.get("prompt") is not None
    if has_messages == has_prompt:
        found = "both" if has_messages else "neither"
        raise ValueError(
            f"{where}: an SFT row has 'prompt' and 'response', or 'messages'; it has {found} "
            "of 'prompt' and 'messages'"
        )
    make = _conversation_row if has_messages else _prompt_response_row
    prompt, response, mask = make(raw, render, where)
    return SftRow(prompt, response, mask, source=f"{path}:{index}")


def fit_length(
    row: SftRow, max_length: int, truncation: Literal["error", "right"], where: str
) -> SftRow:
    """The row within `max_length` tokens: as it is, cut on the right, or an error."""
    length = len(row.prompt_ids) + len(row.response_ids)
    if length <= max_length:
        return row
    if truncation == "error":
        raise ValueError(
            f"{where}: {length} tokens (prompt {len(row.prompt_ids)} + target "
            f"{len(row.response_ids)}), more than sft.max_length={max_length}; raise it, "
            "drop the row, or set sft.truncation=right"
        )
    kept = max_length - len(row.prompt_ids)
    if kept <= 0 or not any(row.loss_mask[:kept]):
        raise ValueError(
            f"{where}: cut to sft.max_length={max_length} tokens no target token is left (the "
            f"prompt has {len(row.prompt_ids)}); raise sft.max_length or drop the row"
        )
    return SftRow(
        row.prompt_ids,
        row.response_ids[:kept],
        row.loss_mask[:kept],
        row.source,
        truncated=True,
    )


class SftDataset:
    """Validated, tokenized SFT rows from one or more parquet/jsonl files, in file order."""

    def __init__(
        self,
        paths: str | Path | Sequence[str | Path],
        tokenizer: Any,
        max_length: int,
        truncation: Literal["error", "right"] = "error",
    ) -> None:
        if max_length < 1:
            raise ValueError(f"sft.max_length must be >= 1, got {max_length}")
        render = ChatRenderer(tokenizer)
        self.paths = [Path(p) for p in ([paths] if isinstance(paths, str | Path) else paths)]
        if not self.paths:
            raise ValueError("SftDataset needs at least one file (sft.train_files), got none")
        self.pad_token_id: int = tokenizer.pad_token_id
        self.rows: list[SftRow] = []
        for path in self.paths:
            for index, raw in enumerate(read_rows(path)):
                row = tokenize_row(raw, render, path, index)
                self.rows.append(fit_length(row, max_length, truncation, f"{path}: row {index}"))
        if not self.rows:
            raise ValueError(f"no SFT rows in {[str(p) for p in self.paths]} (sft.train_files)")
        self.truncated_rows = [row.source for row in self.rows if row.truncated]
        """Rows cut at max_length, as "file:row"."""
        if self.truncated_rows:
            logger.warning(
                "cut %d of %d SFT rows to sft.max_length=%d tokens (sft.truncation=right); "
                "first: %s",
                len(self.truncated_rows),
                len(self.rows),
                max_length,
                ", ".join(self.truncated_rows[:NUM_LOGGED_ROWS]),
            )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> SftRow:
        return self.rows[index]
