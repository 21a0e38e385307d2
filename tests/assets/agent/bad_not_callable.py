"""The schema names a constant, not a function."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    },
]


lookup = "a string"
