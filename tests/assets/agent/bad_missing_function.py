"""The schema names a function the file does not define."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    },
]


def look_up():
    return ""
