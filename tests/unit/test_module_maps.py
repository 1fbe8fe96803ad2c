"""Every folder of the code says what each of its modules holds: a module missing from its folder's map (the
`__init__` docstring; engine/README.md for engine's top level) fails here, so the maps cannot drift."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.parent for top in ("engine", "server") for p in (ROOT / top).rglob("__init__.py"))


def members(folder: Path) -> list[str]:
    """The folder's modules and subpackages, by name."""
    modules = [p.stem for p in folder.glob("*.py") if p.name != "__init__.py"]
    return sorted(modules + [p.parent.name for p in folder.glob("*/__init__.py")])


def unnamed(names: list[str], text: str) -> list[str]:
    return [n for n in names if not re.search(rf"(?<![\w.]){re.escape(n)}(\.py|/)?(?!\w)", text)]


@pytest.mark.parametrize(
    "folder", [p for p in PACKAGES if p != ROOT / "engine"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_each_folders_docstring_names_its_modules(folder):
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
    assert not unnamed(members(folder), doc), f"{folder.relative_to(ROOT)}/__init__.py's docstring lacks these"


def test_the_engines_readme_maps_its_top_level():
    readme = (ROOT / "engine" / "README.md").read_text(encoding="utf-8")
    assert not unnamed(members(ROOT / "engine"), readme), "engine/README.md lacks these"


def test_a_missing_module_is_found():
    assert unnamed(["pool", "cpus", "kv_cache"], "`pool.py` holds ...; kv_cache/ ...") == ["cpus"]
