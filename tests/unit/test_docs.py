"""The README and docs/ stay true to the checkout: the README stays short, every relative link
points to a file (and to a heading there, when it names one), every `hybrid/...` path and
`hybrid.<module>` name the pages write exists, and every `*.md` a docstring under hybrid/
names exists. Each test lists every broken name at once, so one run shows all the drift."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hybrid"
README = ROOT / "README.md"
README_MAX_LINES = 220

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:")
# Not preceded by a path or name character, so /abs/hybrid/x or foo.hybrid.x do not match.
HYBRID_PATH = re.compile(r"(?<![\w./-])hybrid/[\w./-]*")
HYBRID_NAME = re.compile(r"(?<![\w./-])hybrid(?:\.[A-Za-z_]\w*)+")
MARKDOWN_NAME = re.compile(r"[\w./-]*\w\.md\b")
GENERATED_MARKDOWN = {"memory_report.md"}
"""Files a run writes into its output directory, named in docstrings but not in the checkout."""


def pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def label(page: Path) -> str:
    return str(page.relative_to(ROOT))


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces to -."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if target.startswith(EXTERNAL) or target.startswith("#"):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve()
        if not resolved.exists():
            broken.append(f"{label(page)}: link to {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved):
            broken.append(f"{label(page)}: link to {target} (no such heading)")
    return broken


def module_path(parts: list[str]) -> Path | None:
    """The file or package directory of the dotted module `parts`, if the checkout has one."""
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base):
        if candidate.exists():
            return candidate
    return None


def top_level_names(module: Path) -> set[str]:
    """What `module.<name>` can reach without importing: its definitions, assignments and
    imports (a package's `__init__.py` and its submodules)."""
    if module.is_dir():
        names = {p.stem for p in module.glob("*.py")} | {p.name for p in module.iterdir()}
        init = module / "__init__.py"
        if not init.exists():
            return names
        module = init
    else:
        names = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def resolves(dotted: str) -> bool:
    """`hybrid.a.b` names a module, or an attribute defined at the top of the longest module
    prefix (`hybrid.trainer.loop.Driver`)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        module = module_path(parts[:cut])
        if module is not None:
            return cut == len(parts) or parts[cut] in top_level_names(module)
    return False


def docstrings(path: Path) -> list[str]:
    """Module, class and function docstrings and attribute docstrings: every string that
    stands alone as a statement."""
    return [
        node.value.value
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    ]


def test_the_checks_read_real_pages() -> None:
    # A check that finds no page, link or name passes vacuously.
    assert len(pages()) >= 10, [label(p) for p in pages()]
    text = "\n".join(p.read_text(encoding="utf-8") for p in pages())
    assert len(LINK.findall(text)) >= 20
    assert HYBRID_PATH.search(text) and HYBRID_NAME.search(text)
    assert "install" in heading_anchors(ROOT / "docs" / "install.md")
    assert resolves("hybrid.trainer.config") and not resolves("hybrid.no_such_module")


def test_the_readme_stays_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_every_relative_link_points_to_a_file() -> None:
    broken = [entry for page in pages() for entry in broken_links(page)]
    assert not broken, "\n".join(broken)


def test_every_hybrid_path_on_the_pages_exists() -> None:
    missing = sorted(
        {
            f"{label(page)}: {path}"
            for page in pages()
            for path in (m.rstrip(".") for m in HYBRID_PATH.findall(page.read_text("utf-8")))
            if not (ROOT / path).exists()
        }
    )
    assert not missing, "\n".join(missing)


def test_every_hybrid_module_name_on_the_pages_resolves() -> None:
    missing = sorted(
        {
            f"{label(page)}: {name}"
            for page in pages()
            for name in HYBRID_NAME.findall(page.read_text(encoding="utf-8"))
            if not resolves(name)
        }
    )
    assert not missing, "\n".join(missing)


def test_every_markdown_file_a_docstring_names_exists() -> None:
    missing = sorted(
        {
            f"{path.relative_to(ROOT)}: {name}"
            for path in sorted(PACKAGE.rglob("*.py"))
            for text in docstrings(path)
            for name in MARKDOWN_NAME.findall(text)
            if Path(name).name not in GENERATED_MARKDOWN
            and not (ROOT / name).exists()
            and not (ROOT / "docs" / name).exists()
        }
    )
    assert not missing, "\n".join(missing)
