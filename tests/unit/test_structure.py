"""The house rules that a reviewer would otherwise have to remember, checked on the source.

- No function in the product's packages is longer than 80 lines.
- Module names do not collide: a module below the edges (domain, services, adapters, daemon,
  client, predict, maintenance, the top-level modules) has a name no other such module has.
  An edge module (api/, commands/, tui/) is named for the subject it serves, so it may
  share that subject's name.
- A path that a comment or docstring cites is a file of this repository.

The import layering is checked by `lint-imports` (pyproject.toml), also part of `make test`.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("appliance", "maintenance", "tui")
MAX_FUNCTION_LINES = 80
# The packages that translate for a caller (HTTP, the command line, the terminal UI): a module
# there is named for what it serves (the jobs command for the maintenance jobs).
EDGES = ("appliance/api/", "appliance/commands/", "tui/")


def _modules(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_no_function_over_80_lines() -> None:
    long = []
    for path in _modules(*PRODUCT):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{_rel(path)}:{node.lineno} {node.name}() has {lines} lines")
    assert not long, "split these functions:\n" + "\n".join(long)


def _is_edge(rel: str) -> bool:
    return rel.startswith(EDGES)


def test_module_names_below_the_edges_do_not_collide() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in _modules("appliance", "maintenance"):
        rel = _rel(path)
        if path.name in ("__init__.py", "__main__.py") or _is_edge(rel):
            continue
        by_name[path.stem].append(rel)
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"one name, two meanings: {clashes}"


# A cited path: a top-level folder of this repository, or a package folder of appliance
# (as docstrings inside it say "services/store.py"), then a file name with an extension.
_TOPS = (
    "appliance",
    "maintenance",
    "tui",
    "bench",
    "tests",
    "docs",
    "monitoring",
    "scripts",
    "systemd",
)
_SUBPACKAGES = tuple(
    p.name for p in (ROOT / "appliance").iterdir() if p.is_dir() and (p / "__init__.py").exists()
)
_PREFIX = "|".join(_TOPS + _SUBPACKAGES)
_EXTENSIONS = "py|md|yml|yaml|toml|json|sh|tcss|service|csv"
_CITED = re.compile(rf"(?<![\w./-])((?:{_PREFIX})/[\w./*-]*?\w\.(?:{_EXTENSIONS}))(?![\w/])")


def _comment_text(path: Path) -> str:
    """The comments and docstrings of a Python file; the whole text of anything else."""
    text = path.read_text()
    if path.suffix != ".py":
        return text
    parts = [m.group(0) for m in re.finditer(r"#.*", text)]
    for node in ast.walk(ast.parse(text, str(path))):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
    return "\n".join(parts)


def _exists(cited: str) -> bool:
    candidates = [ROOT / cited, ROOT / "appliance" / cited]
    # A cited folder of files ("bench/traces/*.csv") is checked by its folder.
    return any(c.exists() or ("*" in cited and c.parent.exists()) for c in candidates)


def test_cited_paths_are_files_of_this_repository() -> None:
    sources = [
        *_modules(*PRODUCT, "bench", "scripts", "tests"),
        ROOT / "Makefile",
        ROOT / "pyproject.toml",
        ROOT / "config.yaml",
    ]
    missing = []
    for path in sources:
        for match in _CITED.finditer(_comment_text(path)):
            if not _exists(match.group(1)):
                missing.append(f"{_rel(path)} cites {match.group(1)}")
    assert not missing, "these comments point outside the repository:\n" + "\n".join(missing)
