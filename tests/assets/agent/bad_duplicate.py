"""The same tool twice."""

SCHEMA = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
}
TOOLS = [SCHEMA, SCHEMA]


def lookup():
    return ""
