"""Parameters that are not an object schema."""

TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "array", "items": {}}},
    }
]


def lookup():
    return ""
