"""A parameter without default that the model cannot pass and the row cannot bind."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}},
                "required": ["word"],
            },
        },
    },
]


def lookup(word, lang):
    return word
