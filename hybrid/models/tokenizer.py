"""Byte-level tokenizers for the tiny Qwen2 test models, built offline (no merges: one token
per byte, so one token per ASCII character).

Owns the vocabularies, the special/chat tokens and the ChatML chat templates:
- `"text"` (default): all 256 bytes, so every string encodes and decodes exactly (no character
  is unknown; `<|unk|>` exists but is never produced). 260 ids, padded to 272.
- `"arithmetic"`: digits, `+` and `=` only: 16 ids, for learnability experiments. Any other
  character is dropped by the tokenizer (see below); check prompts with `unknown_characters`.
- `"agent"`: digits, `?` and `@` only: 16 ids, for the agent demo (a vault whose code only a
  tool call, `@`, reveals: hybrid/data/agent_task.py). Same template as "arithmetic".

Why byte-level BPE and not a WordLevel tokenizer with an unk token: transformers 5 loads the
tokenizer of every `model_type: qwen2` directory (AutoTokenizer, and so vLLM too) as
`Qwen2Tokenizer`, which keeps only the vocabulary and merges of tokenizer.json and rebuilds
Qwen2's byte-level pipeline around them, with no unk token. We build exactly that object, so
the files on disk, our in-memory tokenizer and what every reader reconstructs agree.

Token ids: 0 `<|endoftext|>` (pad, bos; never prepended), 1 `<|im_start|>`, 2 `<|im_end|>`
(eos), 3 `<|unk|>`, then the byte symbols in byte order, then (a vision-language model's
vocabulary only) Qwen2-VL's four vision tokens, then `<|reserved_N|>` padding, so
`len(tokenizer)` equals the model's `vocab_size` and every id the model can sample decodes.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Literal

from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2Tokenizer

VocabName = Literal["text", "arithmetic", "agent"]
VOCAB_NAMES: tuple[VocabName, ...] = ("text", "arithmetic", "agent")

PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START_TOKEN, EOS_TOKEN, UNK_TOKEN)
PAD_TOKEN_ID, IM_START_TOKEN_ID, EOS_TOKEN_ID, UNK_TOKEN_ID = range(len(SPECIAL_TOKENS))
VISION_START_TOKEN = "<|vision_start|>"
VISION_END_TOKEN = "<|vision_end|>"
IMAGE_PAD_TOKEN = "<|image_pad|>"
"""Where an image's features go: the processor repeats it once per merged patch."""
VIDEO_PAD_TOKEN = "<|video_pad|>"
VISION_TOKENS: tuple[str, ...] = (
    VISION_START_TOKEN,
    VISION_END_TOKEN,
    IMAGE_PAD_TOKEN,
    VIDEO_PAD_TOKEN,
)
"""Qwen2-VL's vision tokens, in the order the vocabulary lists them (after the characters)."""
BOS_TOKEN_ID = PAD_TOKEN_ID  # as in Qwen2

VOCAB_MULTIPLE = 16
"""The vocabulary (and so the embedding matrix) is padded to a multiple of this."""

# Qwen2-style ChatML without the default system prompt.
_CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# The arithmetic vocabulary has no letters or newline: ChatML markers around the content only,
# so `[user: "1+2="]` renders as `<|im_start|>1+2=<|im_end|><|im_start|>`.
_ARITHMETIC_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['content'] + '<|im_end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>' }}{%- endif %}"
)
CHAT_TEMPLATES: dict[VocabName, str] = {
    "text": _CHATML_TEMPLATE,
    "arithmetic": _ARITHMETIC_TEMPLATE,
    "agent": _ARITHMETIC_TEMPLATE,
}
CHARACTERS: dict[VocabName, str] = {
    "arithmetic": string.digits + "+=",
    "agent": string.digits + "?@",
}
"""The characters of the small vocabularies (the "text" one has every byte)."""


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table in byte order: byte b is the symbol at index b."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in symbols):
        symbols[b] = chr(256 + n)
    return [symbols[b] for b in range(256)]


def vocabulary(vocab: VocabName, vision: bool = False) -> list[str]:
    """All tokens of `vocab` in id order: specials, byte symbols, the vision tokens (with
    `vision`), reserved padding."""
    if vocab not in VOCAB_NAMES:
        raise ValueError(f"vocab must be one of {VOCAB_NAMES}, got {vocab!r}")
    symbols = _byte_symbols()
    if vocab in CHARACTERS:
        symbols = [symbols[ord(c)] for c in CHARACTERS[vocab]]
    tokens = [*SPECIAL_TOKENS, *symbols, *(VISION_TOKENS if vision else ())]
    return tokens + [f"<|reserved_{i}|>" for i in range(-len(tokens) % VOCAB_MULTIPLE)]


def vocab_size(vocab: VocabName, vision: bool = False) -> int:
    """Number of token ids of `vocab` (what the model's `vocab_size` is)."""
    return len(vocabulary(vocab, vision))


def unknown_characters(text: str, vocab: VocabName) -> list[str]:
    """Characters of `text` that `vocab` cannot encode (the tokenizer would drop them), in order
    of first appearance. Always empty for "text". Data loaders use it to reject a prompt."""
    if vocab == "text":
        return []
    return list(dict.fromkeys(c for c in text if c not in CHARACTERS[vocab]))


def build_tokenizer(
    vocab: VocabName = "text", model_max_length: int = 512, vision: bool = False
) -> Qwen2Tokenizer:
    """Build the byte-level tokenizer for `vocab` with its chat template; `vision` adds the
    vision tokens (a vision-language model's)."""
    tokens = vocabulary(vocab, vision)
    reserved = [t for t in tokens if t.startswith("<|reserved_")]
    vision_tokens = list(VISION_TOKENS) if vision else []
    tokenizer = Qwen2Tokenizer(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=[],
        bos_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        extra_special_tokens=[IM_START_TOKEN, *vision_tokens, *reserved],
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,  # " ." must decode to " ." for an exact round trip
        chat_template=CHAT_TEMPLATES[vocab],
    )
    assert len(tokenizer) == len(tokens), "special tokens must reuse their vocabulary ids"
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, output_dir: str | Path) -> None:
    """Write tokenizer.json, tokenizer_config.json (with the chat template inside, readable by
    transformers 4 and 5) and the special_tokens_map.json that transformers 5 no longer writes."""
    output_dir = Path(output_dir)
    tokenizer.save_pretrained(output_dir, save_jinja_files=False)
    special_map = json.dumps(tokenizer.special_tokens_map, indent=2, sort_keys=True)
    (output_dir / "special_tokens_map.json").write_text(special_map + "\n", encoding="utf-8")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""A Hugging Face model directory holds at least one of these for its tokenizer."""


def has_tokenizer(directory: str | Path) -> bool:
    """Whether `directory` holds a tokenizer's files."""
    return any((Path(directory) / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a model directory (local files only, never the hub)."""
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
