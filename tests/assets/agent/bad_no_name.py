"""A schema without function.name."""

TOOLS = [{"type": "function", "function": {"parameters": {"type": "object", "properties": {}}}}]
