"""A tool file whose import fails."""

raise RuntimeError("cannot reach\nthe dictionary")
