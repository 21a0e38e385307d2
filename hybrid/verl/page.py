"""docs/verl.md's generated parts: the table of verl's names and what verl's example scripts
become. `python -m hybrid.verl.page docs/verl.md` rewrites them between their markers; a
unit test fails when the page and the table part ways."""

from __future__ import annotations

import sys
from pathlib import Path

from hybrid.verl.table import PREFIXES, TABLE, Derived, Entry, Refused
from hybrid.verl.translate import translate

MARKERS = {
    "table": ("<!-- verl-table:start -->", "<!-- verl-table:end -->"),
    "scripts": ("<!-- verl-scripts:start -->", "<!-- verl-scripts:end -->"),
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _describe(entry: Entry) -> tuple[str, str, str]:
    """(what it is, our field(s), the note)."""
    if isinstance(entry, Refused):
        nearest = f"nearest: `{entry.nearest}`" if entry.nearest else ""
        return "refused", nearest, entry.why
    if isinstance(entry, Derived):
        return "rule", "", entry.note
    if entry.ours:
        return "maps", ", ".join(f"`{name}`" for name in entry.ours), entry.note
    return "accepted", "(nothing to set)", entry.note


def table_markdown() -> str:
    lines = ["| verl name | here | our field | what differs / why |", "|---|---|---|---|"]
    rows = [*TABLE.items(), *((f"{prefix}*", entry) for prefix, entry in PREFIXES.items())]
    for name, entry in rows:
        kind, ours, note = _describe(entry)
        lines.append(f"| `{name}` | {kind} | {ours} | {_cell(note)} |")
    return "\n".join(lines)


def script_overrides(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def scripts_markdown(directory: Path) -> str:
    lines = [
        "| script (verl's path) | overrides | translated | refused |",
        "|---|---|---|---|",
    ]
    for path in sorted(directory.glob("*.txt")):
        source = next(
            (
                line.split(":", 1)[1].strip()
                for line in path.read_text().splitlines()
                if line.startswith("# path:")
            ),
            path.stem,
        )
        overrides = script_overrides(path)
        translation = translate(overrides)
        refused = [refusal.split(":", 1)[0].split("=", 1)[0] for refusal in translation.refused]
        shown = ", ".join(f"`{name}`" for name in refused) or "none"
        translated = len(overrides) - len(refused)
        lines.append(f"| `{source}` | {len(overrides)} | {translated} | {_cell(shown)} |")
    return "\n".join(lines)


def rewrite(page: Path, parts: dict[str, str]) -> str:
    text = page.read_text()
    for name, body in parts.items():
        start, end = MARKERS[name]
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        text = f"{head}{start}\n{body}\n{end}{tail}"
    return text


SCRIPTS_DIR = Path(__file__).resolve().parents[2] / "tests" / "assets" / "verl_scripts"


def main() -> None:
    page = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/verl.md")
    parts = {"table": table_markdown(), "scripts": scripts_markdown(SCRIPTS_DIR)}
    page.write_text(rewrite(page, parts))


if __name__ == "__main__":
    main()
