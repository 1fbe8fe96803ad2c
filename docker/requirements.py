"""The project's requirements from pyproject.toml alone, for the images' dependency layer: its dependencies and
those of the extras named (comma-separated), an extra that names the project's own extras (`test` asks for
`whisper-server[base]`) resolved here instead of looked up on an index. Reading pyproject.toml and nothing else
keeps the layer cached across code and README edits.

    python docker/requirements.py [EXTRAS] > requirements.txt
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    project = pyproject["project"]
    own = re.compile(rf"^{re.escape(project['name'])}\[([^\]]+)\]\s*$")
    out, seen = list(project["dependencies"]), set()
    todo = list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in project["optional-dependencies"][extra]:
            match = own.match(requirement)
            if match:
                todo += [e.strip() for e in match.group(1).split(",")]
            else:
                out.append(requirement)
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    names = [e for e in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if e]
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    print("\n".join(requirements(pyproject, names)))
