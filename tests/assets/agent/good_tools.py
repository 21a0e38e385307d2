"""A tool file that loads: a visible-only tool, one with a hidden parameter bound per row, one
taking **kwargs, and a parameter with a default the model may leave out."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "a + b",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "open_door",
            "description": "Try a word on this prompt's door.",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}, "loud": {"type": "boolean"}},
                "required": ["word"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "record",
            "description": "Echo what it is given, as JSON.",
            "parameters": {"type": "object", "properties": {"note": {"type": ["string", "null"]}}},
        },
    },
]


def add(a, b):
    return a + b  # not a string: shown as JSON


def open_door(word, loud=False, *, password, greeting="welcome"):
    text = greeting if word == password else "locked"
    return text.upper() if loud else text


def record(**kwargs):
    return kwargs
