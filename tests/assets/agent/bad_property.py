"""A schema property the function cannot take."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}, "lang": {"type": "string"}},
                "required": ["word"],
            },
        },
    },
]


def lookup(word):
    return word
