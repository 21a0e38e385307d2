"""The chat template's part in a token-in/token-out agent trajectory: the tokens of each
environment reply, and the start-up check that they are what the template means.

A trajectory is the prompt's tokens, then per turn the tokens the engine sampled and the tokens
of the environment's reply, appended; the history is never re-rendered. So the template renders
only each reply, on its own (`ReplyRenderer.reply_tokens`): after a turn that ended with the
end-of-turn token (eos, e.g. ChatML's `<|im_end|>`) come what the template writes after that
token (ChatML: "\\n"), the reply messages (role "tool", or "user" for an environment's
reply) and the header of the next assistant turn (ChatML: `<|im_start|>assistant\\n`). They are
found by rendering a fixed conversation [user, assistant(probe)] with and without the reply
messages: the reply is the text after the probe's content and end of turn. Only the text after
the probe counts: a template may render the earlier part differently once a message follows
(Qwen3 gives the last assistant turn an empty `<think>` block), which the sampled tokens never
see.

`ReplyRenderer.check` proves at start-up whether this is exact for the run's template: it builds
a small conversation (a query, a turn with a Hermes tool call, the tool's reply, a turn, an
environment's user reply, the answer) twice, as the rollout does (prompt, then per turn its
content and eos, then `reply_tokens`) and rendered whole by the template, and compares the
tokens up to the last eos. It does so once with plain turns and once with every turn opening
with a `<think>` block. A template is *thinking* when the plain turns appear verbatim in its
whole rendering but the turns with reasoning do not (it drops or re-formats the reasoning of
earlier turns, as Qwen3's does before the latest user message); where even the plain turns are
rewritten, the measurement cannot tell, and a template that mentions `</think>` or
`reasoning_content` counts as thinking.

The rule for templates that differ (the caller, hybrid/trainer/agent_setup.py, enforces it): the
sampled tokens are the truth. We train on exactly the tokens the engine generated and saw, never
a re-rendering, and the run logs the check's `detail` at start-up
(`rollout.agent.template_mismatch=keep_sampled`, the default);
`rollout.agent.template_mismatch=error` refuses to start instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

REPLY_ROLES = ("tool", "user")

_PROBE_CONTENT = "Probe turn 7f3a."
"""The dummy assistant turn the replies are rendered after: plain text no template rewrites."""
_PROBE_QUERY = {"role": "user", "content": "What is 1+2?"}
_PROBE_CALL = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
)
_PROBE_TURNS = (_PROBE_CALL, "The calculator says 3.", "1+2 = 3.")
_PROBE_REPLIES: tuple[list[dict[str, Any]], ...] = (
    [{"role": "tool", "name": "calculator", "tool_call_id": "call_0", "content": "3"}],
    [{"role": "user", "content": "Give the equation too."}],
)
_PROBE_REASONING = "<think>\nreasoning\n</think>\n\n"
_THINKING_MARKERS = ("</think>", "reasoning_content")
_SNIPPET_TOKENS = 8


@dataclass(frozen=True)
class TemplateCheck:
    status: Literal["exact", "differs"]
    """exact: the incremental tokens equal the template's whole rendering."""
    thinking: bool
    """The template re-formats or drops the reasoning (`<think>...`) of earlier turns."""
    detail: str
    """One line: "" when exact, else the probe, the first differing token index and both
    renderings decoded around it."""


class ReplyRenderer:
    """The tokens of environment replies under one tokenizer's chat template (and tools)."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools = tools
        eos = tokenizer.eos_token
        if not isinstance(eos, str) or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos_token: agent turns end on it")
        self.eos_token_id: int = tokenizer.eos_token_id
        self._probe_turn = [_PROBE_QUERY, {"role": "assistant", "content": _PROBE_CONTENT}]
        base = self._render(self._probe_turn, generation_prompt=False)
        end = base.rfind(_PROBE_CONTENT)
        if end == -1:
            raise ValueError(
                f"the chat template does not render an assistant turn's content as written "
                f"({_PROBE_CONTENT!r} is not in {base!r})"
            )
        # what the template writes after an assistant turn's content (ChatML: eos, newline)
        self._turn_end = base[end + len(_PROBE_CONTENT) :]
        if not self._turn_end.startswith(eos):
            raise ValueError(
                f"the chat template ends an assistant turn with {self._turn_end!r}, not with the "
                f"tokenizer's eos_token {eos!r}: set the tokenizer's eos_token to the template's "
                "end-of-turn token (a turn stops on eos)"
            )
        self._after_eos = self._turn_end[len(eos) :]

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt
            )
        except Exception as error:  # the template is the model's code: name what it was given
            roles = [message.get("role") for message in messages]
            tools = f"{len(self.tools)} tools" if self.tools else "no tools"
            raise ValueError(
                f"the tokenizer's chat template cannot render messages with roles {roles} and "
                f"{tools}: {type(error).__name__}: {error}"
            ) from error
        if not isinstance(text, str):
            raise ValueError(
                f"the tokenizer's chat template rendered {type(text).__name__}, not text"
            )
        return text

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _reply_text(self, messages: list[dict[str, Any]], turn_stopped: bool = True) -> str:
        if not messages:
            raise ValueError("an environment reply needs at least one message")
        for i, message in enumerate(messages):
            if message.get("role") not in REPLY_ROLES or not isinstance(
                message.get("content"), str
            ):
                raise ValueError(
                    f"environment reply message {i} must have a role in {REPLY_ROLES} and a "
                    f"string content, got {message!r}"
                )
        whole = self._render(self._probe_turn + messages, generation_prompt=True)
        probe_end = _PROBE_CONTENT + self._turn_end
        start = whole.find(probe_end)
        if start == -1:
            raise ValueError(
                "the chat template renders an assistant turn differently once a reply follows "
                f"it ({probe_end!r} is not in {whole!r}): its replies cannot be appended as tokens"
            )
        reply = whole[start + len(probe_end) :]
        return (self._after_eos if turn_stopped else self._turn_end) + reply

    def reply_tokens(self, messages: list[dict[str, Any]], turn_stopped: bool = True) -> list[int]:
        """The tokens to append after a model turn for the reply `messages` (role "tool", or
        "user" for an environment), through the next assistant turn's header.

        turn_stopped: the turn ended with the eos token (it is among the sampled tokens), so
        only what the template writes after eos comes first; else (the turn was cut) the whole
        end of turn does."""
        return self._encode(self._reply_text(messages, turn_stopped))

    def check(self) -> TemplateCheck:
        """Whether the incremental tokens equal the template's whole rendering (module doc)."""
        plain = [*_PROBE_TURNS]
        reasoned = [_PROBE_REASONING + turn for turn in _PROBE_TURNS]
        plain_kept, plain_detail = self._probe(plain)
        reasoned_kept, reasoned_detail = self._probe(reasoned)
        if plain_kept:
            thinking = not reasoned_kept
        else:
            template = str(getattr(self.tokenizer, "chat_template", "") or "")
            thinking = any(marker in template for marker in _THINKING_MARKERS)
        # A thinking model writes <think> in every turn: that probe says what its runs see.
        details = [("turns with <think>", reasoned_detail), ("plain turns", plain_detail)]
        if not thinking:
            details.reverse()
        for probe, detail in details:
            if detail:
                return TemplateCheck("differs", thinking, f"{probe}: {detail}")
        return TemplateCheck("exact", thinking, "")

    def _probe(self, turns: list[str]) -> tuple[bool, str]:
        """Render the probe conversation with these assistant turns both ways: (every turn
        appears verbatim in the whole rendering, where the tokens first differ or "")."""
        messages: list[dict[str, Any]] = [_PROBE_QUERY]
        incremental = self._encode(self._render(messages, generation_prompt=True))
        for i, turn in enumerate(turns):
            incremental += [*self._encode(turn), self.eos_token_id]
            messages.append({"role": "assistant", "content": turn})
            if i < len(_PROBE_REPLIES):
                incremental += self.reply_tokens(_PROBE_REPLIES[i])
                messages += _PROBE_REPLIES[i]
        whole_text = self._render(messages, generation_prompt=False)
        kept = all(turn in whole_text for turn in turns)
        return kept, self._first_difference(incremental, self._encode(whole_text))

    def _first_difference(self, incremental: list[int], whole: list[int]) -> str:
        """Empty when `whole` starts with `incremental` (what the template writes after the
        last eos is not compared), else where they first differ, decoded around it."""
        index = next(
            (i for i, (a, b) in enumerate(zip(incremental, whole, strict=False)) if a != b),
            min(len(incremental), len(whole)),
        )
        if index == len(incremental):
            return ""

        def around(tokens: list[int]) -> str:
            window = tokens[max(index - _SNIPPET_TOKENS, 0) : index + _SNIPPET_TOKENS]
            return repr(self.tokenizer.decode(window))

        return (
            f"token {index}: the whole rendering has {around(whole)}, the incremental tokens "
            f"have {around(incremental)}"
        )
