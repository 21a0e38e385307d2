"""Prompt files on disk to tokenized rows: `PromptDataset`, and `read_rows`/`write_rows`.

The file layout is verl's, one row per prompt:
  - `prompt`: the chat, a non-empty list of {"role": str, "content": str} messages;
  - `data_source`: which task and reward function the row belongs to (str);
  - `reward_model`: a dict with `ground_truth` (str, number, dict or list) and optionally `style`;
  - `extra_info`: a dict passed through to the reward function (optional);
  - `images`: a vision-language row's images, one `<image>` placeholder each in the messages
    (optional; hybrid/data/vision_prompts.py reads them).
Files are parquet or jsonl, chosen by suffix. Every row is validated when loaded, and an error
names the file, the row index and the field.

`PromptDataset` applies the tokenizer's chat template once, up front, and drops prompts longer
than `max_prompt_length` tokens. The drop is counted (`num_filtered`, `filtered_rows`) and
logged in one warning, never silent. A row with images is never dropped: its image spans
cannot be cut, so a prompt too long with its image tokens is an error naming the row. Batching
and shuffling live in `hybrid/data/loader.py`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from hybrid.data.images import IMAGES_COLUMN, ImageSet
from hybrid.data.vision_prompts import collapse_pad_runs, count_placeholders, read_row_images

if TYPE_CHECKING:
    from hybrid.data.vision_prompts import VisionProcessor

logger = logging.getLogger(__name__)

SUPPORTED_SUFFIXES: tuple[str, ...] = (".parquet", ".jsonl")
NUM_LOGGED_ROWS = 5
"""How many filtered row indices the filtering warning lists."""


def _check_suffix(path: Path) -> None:
    if path.suffix not in SUPPORTED_SUFFIXES:
        raise ValueError(
            f"unsupported prompt file {path}: suffix {path.suffix!r} is not one of "
            f"{SUPPORTED_SUFFIXES}"
        )


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a parquet or jsonl file as plain dicts (parquet structs become dicts)."""
    path = Path(path)
    _check_suffix(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    if path.suffix == ".parquet":
        _check_parquet(path)
        try:
            return pq.read_table(path).to_pylist()
        except pa.ArrowException as e:
            raise ValueError(f"{path}: not a readable parquet file: {e}") from e
    rows = []
    with path.open(encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {line_number} is not valid JSON: {e}") from e
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}: line {line_number} is a {type(row).__name__}, not an object"
                )
            rows.append(row)
    return rows


PARQUET_MAGIC = b"PAR1"
"""A parquet file begins and ends with these four bytes."""


def _check_parquet(path: Path) -> None:
    """A file named .parquet that is not one (a CSV renamed, say) is named with what it looks
    like, not left to pyarrow's error."""
    with path.open("rb") as f:
        head = f.read(64)
        f.seek(max(0, path.stat().st_size - 4))
        tail = f.read(4)
    if head[:4] == PARQUET_MAGIC and tail == PARQUET_MAGIC:
        return
    text = head.decode("utf-8", errors="replace").splitlines()[0] if head else ""
    looks = f"its first line is {text[:60]!r}" if head else "it is empty"
    raise ValueError(
        f"{path} is named .parquet but is not a parquet file ({looks}); prompt files are "
        f"parquet or jsonl (one JSON object per line, named .jsonl)"
    )


def write_rows(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows to a parquet or jsonl file (by suffix), creating the parent folder."""
    path = Path(path)
    _check_suffix(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist([dict(row) for row in rows]), path)
    else:
        with path.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


@dataclass(frozen=True)
class PromptRow:
    """One validated, tokenized prompt."""

    token_ids: list[int]
    """The chat-templated prompt with the generation prompt appended, without padding."""
    data_source: str
    ground_truth: str
    """The reward model's ground truth; a dict or list is JSON-dumped."""
    extra_info: dict[str, Any]
    raw_prompt: str
    """Content of the last user message (of the last message if no message is from the user)."""
    source: str
    """Where the row came from, as "file:row" (for error messages and logs)."""
    images: ImageSet | None = None
    """The images its token ids hold spans for, in order (None: a text-only prompt)."""


@dataclass(frozen=True)
class _Checked:
    messages: list[dict[str, str]]
    data_source: str
    ground_truth: str
    extra_info: dict[str, Any]


def _ground_truth_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def check_messages(messages: Any, key: str, where: str) -> list[dict[str, str]]:
    """The chat messages of field `key` as plain {role, content} dicts; anything else is
    refused naming `where` ("file: row i") and the field."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(
            f"{where}: field {key!r} must be a non-empty list of {{role, content}} messages, "
            f"got {type(messages).__name__} {messages!r:.80}"
        )
    for i, message in enumerate(messages):
        if not (
            isinstance(message, Mapping)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise ValueError(
                f"{where}: field {key!r} message {i} must be a dict with str 'role' and "
                f"'content', got {message!r:.80}"
            )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _check_row(row: Mapping[str, Any], prompt_key: str, where: str) -> _Checked:
    """Validate one raw row; `where` is "file: row i" for the error messages."""
    if prompt_key not in row or row[prompt_key] is None:
        raise ValueError(f"{where}: field {prompt_key!r} is missing")
    messages = row[prompt_key]
    check_messages(messages, prompt_key, where)  # validated; the rows' own dicts are kept
    data_source = row.get("data_source")
    if not isinstance(data_source, str) or not data_source:
        raise ValueError(f"{where}: field 'data_source' is missing or not a non-empty str")
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        raise ValueError(f"{where}: field 'reward_model.ground_truth' is missing")
    extra_info = row.get("extra_info")
    if extra_info is not None and not isinstance(extra_info, Mapping):
        raise ValueError(
            f"{where}: field 'extra_info' must be a dict, got {type(extra_info).__name__}"
        )
    return _Checked(
        messages=[{"role": m["role"], "content": m["content"]} for m in messages],
        data_source=data_source,
        ground_truth=_ground_truth_text(reward_model["ground_truth"]),
        extra_info=dict(extra_info or {}),
    )


def _check_round_trip(
    tokenizer: Any, text: str, token_ids: list[int], where: str, collapse_pads: bool = False
) -> None:
    """A small vocabulary can drop characters it has no token for (the arithmetic one does):
    refuse the row rather than train on a prompt that silently lost them. `collapse_pads`:
    `text` holds one `<|image_pad|>` per image, the ids each image's expanded run."""
    decoded = tokenizer.decode(token_ids, skip_special_tokens=False)
    if collapse_pads:
        decoded = collapse_pad_runs(decoded)
    if decoded != text:
        lost = sorted(set(text) - set(decoded))
        raise ValueError(
            f"{where}: field 'prompt' has characters the tokenizer cannot encode: {lost} "
            f"(the prompt would lose them); use a tokenizer whose vocabulary covers them"
        )


def _raw_prompt(messages: list[dict[str, str]]) -> str:
    user = [m["content"] for m in messages if m["role"] == "user"]
    return user[-1] if user else messages[-1]["content"]


class PromptDataset:
    """Validated, chat-templated prompts from one or more parquet/jsonl files, in file order.

    Prompts longer than `max_prompt_length` tokens are dropped: `num_filtered` counts them,
    `filtered_rows` lists them as "file:row", and one warning is logged per dataset.
    """

    def __init__(
        self,
        paths: str | Path | Sequence[str | Path],
        tokenizer: Any,
        max_prompt_length: int,
        prompt_key: str = "prompt",
        tools: list[dict[str, Any]] | None = None,
        *,
        processor: VisionProcessor | None = None,
        max_images: int | None = None,
    ) -> None:
        """`tools`: OpenAI-style tool schemas the chat template lists in every prompt (an
        agent run's tools; None: none). `processor`: a vision-language model's (rows may
        then hold images; None: a text-only model, and a row with images is refused).
        `max_images`: the most images one row may hold (rollout.max_images; None: no limit)."""
        if max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad_token_id; left padding needs one")
        self.paths = [Path(p) for p in ([paths] if isinstance(paths, str | Path) else paths)]
        if not self.paths:
            raise ValueError("PromptDataset needs at least one file, got an empty list")
        self.max_prompt_length = max_prompt_length
        self.tokenizer = tokenizer
        self.tools = tools
        self.processor = processor
        self.max_images = max_images
        self.pad_token_id: int = tokenizer.pad_token_id
        self.rows: list[PromptRow] = []
        self.filtered_rows: list[str] = []
        """Prompts dropped for length, as "file:row"."""
        num_read = 0
        for path in self.paths:
            for index, raw in enumerate(read_rows(path)):
                num_read += 1
                where = f"{path}: row {index}"
                checked = _check_row(raw, prompt_key, where)
                images = read_row_images(raw.get(IMAGES_COLUMN), path, index)
                if images:
                    token_ids = self._image_prompt_ids(checked.messages, images, where)
                else:
                    token_ids = self._text_prompt_ids(checked.messages, where)
                source = f"{path}:{index}"
                if len(token_ids) > max_prompt_length:
                    self.filtered_rows.append(source)
                    continue
                self.rows.append(
                    PromptRow(
                        token_ids=token_ids,
                        data_source=checked.data_source,
                        ground_truth=checked.ground_truth,
                        extra_info=checked.extra_info,
                        raw_prompt=_raw_prompt(checked.messages),
                        source=source,
                        images=images or None,
                    )
                )
        if self.filtered_rows:
            logger.warning(
                "filtered %d of %d prompts longer than max_prompt_length=%d tokens; first: %s",
                self.num_filtered,
                num_read,
                max_prompt_length,
                ", ".join(self.filtered_rows[:NUM_LOGGED_ROWS]),
            )
        self.has_images = any(row.images is not None for row in self.rows)
        """Whether any row holds images (the loader's batches then carry an images column)."""
        if not self.rows:
            raise ValueError(
                f"no prompts left in {[str(p) for p in self.paths]}: {num_read} read, "
                f"{self.num_filtered} longer than max_prompt_length={max_prompt_length}"
            )

    def _text_prompt_ids(self, messages: list[dict[str, str]], where: str) -> list[int]:
        if self.processor is not None:
            self._check_images(messages, ImageSet(()), where)
        text = self.tokenizer.apply_chat_template(
            messages, tools=self.tools, add_generation_prompt=True, tokenize=False
        )
        token_ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        _check_round_trip(self.tokenizer, text, token_ids, where)
        return token_ids

    def _image_prompt_ids(
        self, messages: list[dict[str, str]], images: ImageSet, where: str
    ) -> list[int]:
        """The expanded ids of a row with images; one too long for max_prompt_length is an
        error (its image spans cannot be cut), never a silent drop."""
        processor = self.processor
        if processor is None:
            raise ValueError(
                f"{where}: the row has {len(images)} image(s) in field {IMAGES_COLUMN!r} but "
                "the model (model.path) is text-only: the model has no image "
                "processor (preprocessor_config.json); use a vision-language model or drop the "
                "images"
            )
        self._check_images(messages, images, where)
        token_ids = processor.prompt_ids(messages, images.decode(), self.tools)
        _check_round_trip(
            self.tokenizer,
            processor.template_text(messages, self.tools),
            token_ids,
            where,
            collapse_pads=True,
        )
        if len(token_ids) > self.max_prompt_length:
            num_image_tokens = token_ids.count(processor.image_pad_id)
            raise ValueError(
                f"{where}: the prompt is {len(token_ids)} tokens, {num_image_tokens} of them "
                f"image tokens of {len(images)} image(s), longer than "
                f"data.max_prompt_length={self.max_prompt_length}; an image span is never cut, "
                "so raise data.max_prompt_length or lower the image processor's pixel budget "
                "(max_pixels / size.longest_edge in the model's preprocessor_config.json)"
            )
        return token_ids

    def _check_images(self, messages: list[dict[str, str]], images: ImageSet, where: str) -> None:
        num_placeholders = count_placeholders(messages)
        if num_placeholders != len(images):
            raise ValueError(
                f"{where}: the messages hold {num_placeholders} <image> placeholder(s) but field "
                f"{IMAGES_COLUMN!r} holds {len(images)} image(s); each image needs exactly one "
                "placeholder, in order"
            )
        if self.max_images is not None and len(images) > self.max_images:
            raise ValueError(
                f"{where}: {len(images)} images, more than rollout.max_images={self.max_images}"
            )

    @property
    def num_filtered(self) -> int:
        """Prompts dropped because they were longer than `max_prompt_length` tokens."""
        return len(self.filtered_rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> PromptRow:
        return self.rows[index]
