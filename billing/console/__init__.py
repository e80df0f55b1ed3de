"""The web console (CONTRACT "Console (v2)"): server-rendered pages over the domain services.

``install(app)`` mounts the pages under ``/console``, their static files under
``/console/static`` and an offline ``/docs`` (Swagger UI served from this package). Pages call
the domain services in-process (``billing.calllog``, ``billing.export``), never the HTTP API.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from billing.console import docs, routes
from billing.console.render import STATIC_DIR
from billing.console.routes import FORM_PATHS

__all__ = ["FORM_PATHS", "install"]


def install(app: FastAPI) -> None:
    """Add the console's routes, its static files and the offline ``/docs`` to ``app``."""
    app.include_router(routes.router)
    app.include_router(docs.router)
    app.mount("/console/static", StaticFiles(directory=STATIC_DIR), name="console-static")
