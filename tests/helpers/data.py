"""Where the test clips are: tests/data (shipped with the repository) or the folder WHISPER_TEST_DATA names.

Nothing here imports pytest at module level: the benchmarks read DATA too.
"""

from __future__ import annotations

import os
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[1] / "data"
ENV = "WHISPER_TEST_DATA"
DATA = Path(os.environ.get(ENV) or SHIPPED)


def missing(name: str) -> str:
    """Why a test skips when a clip it names is not in DATA."""
    return f"{name} is not in {DATA.name}/ (set {ENV} to a folder that has it, such as a larger collection)"
