"""A tool-call parser from a file: a line "CALL name" calls that tool without arguments."""

from hybrid.rollout.agent.parsers import ParsedTurn
from hybrid.rollout.agent.tools import ToolCall


class UpperParser:
    def parse(self, text: str) -> ParsedTurn:
        calls = [
            ToolCall(line.split()[1], {})
            for line in text.splitlines()
            if line.startswith("CALL ") and len(line.split()) == 2
        ]
        return ParsedTurn(calls=calls, errors=[])


def make_parser() -> UpperParser:
    return UpperParser()


NOT_A_PARSER = 3


def no_parse() -> object:
    return object()
