"""``/docs``: Swagger UI from the files shipped in ``billing/console/static/swagger``
(``swagger-ui-dist``, Apache-2.0), so the API's documentation works without internet."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)

_STATIC = "/console/static/swagger"


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    """The Swagger UI page over ``/openapi.json``, every asset from this server."""
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} - API",
        swagger_js_url=f"{root}{_STATIC}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{_STATIC}/swagger-ui.css",
        swagger_favicon_url=f"{root}{_STATIC}/favicon-32x32.png",
    )
