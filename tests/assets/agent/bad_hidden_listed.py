"""A hidden (keyword-only) parameter listed in the schema."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}, "key": {"type": "string"}},
                "required": ["word"],
            },
        },
    },
]


def lookup(word, *, key):
    return word
