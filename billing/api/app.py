"""The FastAPI application: routers, error rendering, metrics and the background reconciler."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from billing.api import calls, errors, events, exports, health, prices, reconcile, usage
from billing.api.state import AppState
from billing.auth.guard import TokenCache
from billing.metrics import Metrics
from billing.reconcile.runner import run_pass
from billing.settings import Settings, get_settings
from billing.storage.db import make_engine, make_sessionmaker
from billing.storage.models import Call

log = logging.getLogger("billing")


class _LatencyMiddleware:
    """Observes every HTTP request's latency, labelled by route template and status.

    ``POST /v1/events`` — the one route gateways call thousands of times a second — is answered
    here by ``events.serve_ingest`` (the same guard, handler and error rendering as the routed
    endpoint, which stays registered for the OpenAPI schema): routing, dependency solving and
    the exception middleware cost more than the rest of a single-event post.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self._observers: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        ingest = (
            scope["path"] == events.PATH
            and scope["method"] == "POST"
            and not scope.get("root_path")
            and "app" in scope
        )
        try:
            if ingest:
                state = scope["app"].state.billing
                response = await events.serve_ingest(Request(scope, receive), state)
                await response(scope, receive, send_wrapper)
            else:
                await self.app(scope, receive, send_wrapper)
        finally:
            path = events.PATH if ingest else getattr(scope.get("route"), "path", "unmatched")
            key = (scope["method"], path, status)
            observer = self._observers.get(key)
            if observer is None:
                observer = self.metrics.request_latency.labels(scope["method"], path, str(status))
                if len(self._observers) < 1000:
                    self._observers[key] = observer
            observer.observe(time.perf_counter() - started)


def create_app(settings: Settings | None = None, *, background: bool = False) -> FastAPI:
    """Build the app for ``settings`` (the environment's by default).

    The database must already be at the migration head (``billing serve`` and ``billing migrate``
    take care of it). With ``background=True`` the app runs reconciliation passes every
    ``settings.reconcile_interval_s`` seconds while it serves.
    """
    settings = settings or get_settings()
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)

    def count_open() -> int | None:
        try:
            with sessions() as session:
                return session.scalar(select(func.count()).where(Call.settled.is_(False)))
        except SQLAlchemyError:
            return None

    state = AppState(settings, engine, sessions, Metrics(count_open))

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_reconcile_loop(state)) if background else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            engine.dispose()

    app = FastAPI(
        title="billing",
        version="1",
        summary="Streaming usage and billing accounting for LLM API gateways",
        lifespan=lifespan,
    )
    app.state.billing = state
    app.state.tokens = TokenCache(sessions)
    errors.install(app, settings.db_retry_after_s)
    for module in _ROUTERS:
        app.include_router(module.router)
    app.add_middleware(_LatencyMiddleware, metrics=state.metrics)
    return app


_ROUTERS: list[Any] = [events, calls, usage, prices, reconcile, health, exports]


async def _reconcile_loop(state: AppState) -> None:
    """Background passes; a failed pass is logged and retried at the next interval."""
    while True:
        await asyncio.sleep(state.settings.reconcile_interval_s)
        try:
            await asyncio.to_thread(run_pass, state.sessions, state.settings, state.metrics)
        except Exception:
            log.exception("background reconciliation pass failed; retrying next interval")
