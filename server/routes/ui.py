"""GET /: the playground (server/ui/: one static page, its script and styles), unless --no-ui.

The page uses only the public API, with URLs relative to itself, so it works behind a reverse proxy's path
prefix; its files ship in the package (no build step, nothing fetched from elsewhere: it works offline).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

UI = Path(__file__).resolve().parents[1] / "ui"
# the page is small and changes with the server: always revalidated, never served stale after an upgrade
NO_CACHE = {"Cache-Control": "no-cache"}

router = APIRouter(tags=["ui"])


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(UI / "index.html", media_type="text/html", headers=NO_CACHE)


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui", StaticFiles(directory=UI), name="ui")
