"""Replies render on their own as the tokens the template puts after a model turn, and the
template check tells exact templates from thinking ones and other mismatches: on tiny templates
built here and on real models' templates (tests/assets/chat_templates) over a byte-level
tokenizer that encodes any text exactly."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from hybrid.models.tokenizer import build_tokenizer
from hybrid.rollout.agent.chat import ReplyRenderer, TemplateCheck
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.unit

TEMPLATES = REPO_ROOT / "tests" / "assets" / "chat_templates"
TEMPLATE_SHA256 = {
    "qwen2_5_7b_instruct": "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    "qwen3_0_6b": "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5",
    "granite_3_3_2b_instruct": "3c71df5f659987462c882bf9e295b597dc19902467a7312ea382c5896681bc02",
}
GRANITE_TOKENS = ["<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "The expression."}},
                "required": ["expression"],
            },
        },
    }
]
TOOL_REPLY = [{"role": "tool", "name": "calculator", "content": "3"}]


def tokenizer_with(
    template: str, eos: str = "<|im_end|>", special_tokens: list[str] | None = None
) -> PreTrainedTokenizerBase:
    """The byte-level "text" tokenizer with `template`, its special tokens and its end of turn."""
    tokenizer = build_tokenizer("text", model_max_length=100_000)
    if special_tokens:
        tokenizer.add_tokens(special_tokens, special_tokens=True)
    tokenizer.eos_token = eos
    tokenizer.chat_template = template
    return tokenizer


def real_tokenizer(name: str) -> PreTrainedTokenizerBase:
    template = (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    if name.startswith("granite"):
        return tokenizer_with(template, "<|end_of_text|>", GRANITE_TOKENS)
    return tokenizer_with(template)


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


# --- the tiny ChatML template of hybrid/models/tokenizer.py ---


def test_chatml_reply_is_the_text_after_eos_the_messages_and_the_next_header() -> None:
    tokenizer = build_tokenizer("text")
    tokens = ReplyRenderer(tokenizer).reply_tokens([{"role": "tool", "content": "3"}])
    expected = "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n"
    assert tokens == encode(tokenizer, expected)


def test_chatml_reply_of_several_messages_keeps_their_order() -> None:
    tokenizer = build_tokenizer("text")
    messages: list[dict[str, Any]] = [
        {"role": "tool", "content": "3"},
        {"role": "user", "content": "Now 2+2?"},
    ]
    expected = (
        "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>user\nNow 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert ReplyRenderer(tokenizer).reply_tokens(messages) == encode(tokenizer, expected)


def test_a_cut_turn_gets_the_whole_end_of_turn_first() -> None:
    tokenizer = build_tokenizer("text")
    tokens = ReplyRenderer(tokenizer).reply_tokens([{"role": "tool", "content": ""}], False)
    expected = "<|im_end|>\n<|im_start|>tool\n<|im_end|>\n<|im_start|>assistant\n"
    assert tokens == encode(tokenizer, expected)


def test_chatml_template_checks_exact() -> None:
    check = ReplyRenderer(build_tokenizer("text")).check()
    assert check == TemplateCheck(status="exact", thinking=False, detail="")


# --- real models' templates ---


@pytest.mark.parametrize("name", sorted(TEMPLATE_SHA256))
def test_stored_templates_are_unchanged(name: str) -> None:
    """The files are the models' strings byte for byte (README.md there): an editor that
    strips the trailing newline of Qwen2.5's template must fail here."""
    digest = hashlib.sha256((TEMPLATES / f"{name}.jinja").read_bytes()).hexdigest()
    assert digest == TEMPLATE_SHA256[name]


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no_tools", "tools"])
def test_qwen2_5_renders_tool_replies_exactly(tools: list[dict[str, Any]] | None) -> None:
    tokenizer = real_tokenizer("qwen2_5_7b_instruct")
    renderer = ReplyRenderer(tokenizer, tools)
    expected = (
        "\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert renderer.reply_tokens(TOOL_REPLY) == encode(tokenizer, expected)
    assert renderer.check() == TemplateCheck(status="exact", thinking=False, detail="")


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no_tools", "tools"])
def test_granite_3_3_renders_tool_replies_exactly(tools: list[dict[str, Any]] | None) -> None:
    tokenizer = real_tokenizer("granite_3_3_2b_instruct")
    renderer = ReplyRenderer(tokenizer, tools)
    expected = (
        "\n<|start_of_role|>tool<|end_of_role|>3<|end_of_text|>\n"
        "<|start_of_role|>assistant<|end_of_role|>"
    )
    assert renderer.reply_tokens(TOOL_REPLY) == encode(tokenizer, expected)
    assert renderer.check() == TemplateCheck(status="exact", thinking=False, detail="")


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no_tools", "tools"])
def test_qwen3_is_a_thinking_template_that_differs(tools: list[dict[str, Any]] | None) -> None:
    """Qwen3 renders replies like Qwen2.5, but a whole rendering drops the reasoning of the turns
    before the environment's user message: the rule for differing templates applies."""
    tokenizer = real_tokenizer("qwen3_0_6b")
    renderer = ReplyRenderer(tokenizer, tools)
    expected = (
        "\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert renderer.reply_tokens(TOOL_REPLY) == encode(tokenizer, expected)
    check = renderer.check()
    assert (check.status, check.thinking) == ("differs", True)
    # where: the whole rendering has the first turn's tool call where we kept its reasoning
    assert check.detail.startswith("turns with <think>: token ")
    whole, incremental = check.detail.split("the incremental tokens have")
    assert "<tool_call" in whole and "<think>" in incremental
    assert "\n" not in check.detail


# --- tiny templates with one quirk each ---

_HEAD = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
_TAIL = "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"


def test_a_last_message_rendered_differently_differs_without_thinking() -> None:
    """Hermes-3's quirk: a tool message followed by a turn gets a newline it lacks when last."""
    template = (
        _HEAD + "{{- message['content'] }}"
        "{%- if message['role'] == 'tool' and not loop.last %}{{- '\\n' }}{%- endif %}"
        "{{- '<|im_end|>\\n' }}" + _TAIL
    )
    check = ReplyRenderer(tokenizer_with(template)).check()
    assert (check.status, check.thinking) == ("differs", False)
    assert check.detail.startswith("plain turns: token ")


def test_rewritten_turns_fall_back_to_the_template_s_thinking_markers() -> None:
    """A template that rewrites the turns themselves cannot be measured for thinking (the plain
    turns are not verbatim either): mentioning </think> or reasoning_content makes it one."""
    rewriting = (
        _HEAD
        + "{{- message['content'] | replace('calculator', 'calc') }}{{- '<|im_end|>\\n' }}"
        + _TAIL
    )
    for template, thinking in ((rewriting, False), ("{# keeps </think> #}" + rewriting, True)):
        check = ReplyRenderer(tokenizer_with(template)).check()
        assert (check.status, check.thinking) == ("differs", thinking)


# --- errors name the problem ---


def test_an_eos_that_does_not_end_the_template_s_turns_is_refused() -> None:
    tokenizer = build_tokenizer("text")
    tokenizer.eos_token = "<|endoftext|>"
    with pytest.raises(ValueError, match="not with the tokenizer's eos_token '<\\|endoftext\\|>'"):
        ReplyRenderer(tokenizer)


def test_a_template_that_rewrites_a_turn_once_a_reply_follows_is_refused() -> None:
    template = (
        _HEAD + "{%- if message['role'] != 'assistant' or loop.last %}{{- message['content'] }}"
        "{%- endif %}{{- '<|im_end|>\\n' }}" + _TAIL
    )
    renderer = ReplyRenderer(tokenizer_with(template))
    with pytest.raises(ValueError, match="renders an assistant turn differently"):
        renderer.reply_tokens([{"role": "tool", "content": "3"}])


def test_a_template_that_cannot_render_names_the_roles_and_tools() -> None:
    needs_tools = "{%- for tool in tools %}{%- endfor %}" + build_tokenizer("text").chat_template
    with pytest.raises(ValueError, match=r"roles \['user', 'assistant'\] and no tools: TypeError"):
        ReplyRenderer(tokenizer_with(needs_tools))


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "assistant", "content": "hi"}],
        [{"role": "tool"}],
        [{"role": "user", "content": 3}],
    ],
    ids=["empty", "assistant", "no_content", "content_not_text"],
)
def test_bad_reply_messages_are_refused(messages: list[dict[str, Any]]) -> None:
    renderer = ReplyRenderer(build_tokenizer("text"))
    with pytest.raises(ValueError, match="environment reply"):
        renderer.reply_tokens(messages)
