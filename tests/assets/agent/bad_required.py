"""A required name that is not a property."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}},
                "required": ["word", "lang"],
            },
        },
    },
]


def lookup(word, lang="en"):
    return word
