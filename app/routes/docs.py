"""``/docs`` and ``/redoc`` with their assets served from the package.

FastAPI's own pages load Swagger UI and Redoc from a CDN, so they stay blank
without internet. These are FastAPI's "Custom Docs UI Static Assets
(Self-Hosting)" recipe: the same pages, pointing at ``/static``, where the app
serves the files vendored from npm under ``app/static`` (swagger-ui-dist
5.35.0 and redoc 2.5.4, each with its licence; Redoc's Google fonts are left
out, so it uses the browser's own).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["STATIC_PATH", "install_docs"]

STATIC_PATH = "/static"
_STATIC_DIR = Path(str(files("app") / "static"))


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs``, ``/redoc`` and their assets; ``app`` must not have FastAPI's own."""
    assert app.docs_url is None and app.redoc_url is None and app.openapi_url
    openapi_url = app.openapi_url
    app.mount(STATIC_PATH, StaticFiles(directory=_STATIC_DIR), name="static")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = _root_path(request)
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{STATIC_PATH}/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{STATIC_PATH}/swagger-ui/swagger-ui.css",
            swagger_favicon_url=f"{root}{STATIC_PATH}/swagger-ui/favicon-32x32.png",
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = _root_path(request)
        return get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{STATIC_PATH}/redoc/redoc.standalone.js",
            redoc_favicon_url=f"{root}{STATIC_PATH}/swagger-ui/favicon-32x32.png",
            with_google_fonts=False,
        )


def _root_path(request: Request) -> str:
    """The prefix a proxy serves the app under, as FastAPI's own pages use it."""
    return str(request.scope.get("root_path", "")).rstrip("/")
