"""The FastAPI application: routers, error rendering, metrics and the background reconciler."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from billing import destinations
from billing.api import (
    authorizations,
    budgets,
    calls,
    credits,
    direct,
    drift,
    errors,
    events,
    exports,
    health,
    keys,
    limits,
    plans,
    prices,
    providers,
    reconcile,
    schema,
    usage,
)
from billing.api import tokens as tokens_api
from billing.api.limits import RequestLimits
from billing.api.openapi import hoist_definitions
from billing.api.state import AppState
from billing.auth.guard import LAST_USED_EVERY_S, TokenCache
from billing.budgets.webhooks import DeliveryWorker
from billing.console import FORM_PATHS
from billing.console import install as install_console
from billing.errors import FieldError, ValidationFailed
from billing.ingest.partitions import MAINTENANCE_EVERY_S, make_partitions_ahead
from billing.ingest.validation import MAX_BODY_BYTES
from billing.metrics import Metrics
from billing.observe.collector import LedgerCollector
from billing.providers.schemas import MAX_REPORT_BYTES
from billing.reconcile.runner import Backoff, run_pass
from billing.settings import Settings, get_settings
from billing.storage.db import make_engine, make_sessionmaker
from billing.storage.models import Call

log = logging.getLogger("billing")


class _Latency:
    """The request latency histogram's children, by (method, route template, status)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._observers: dict[tuple[str, str, int], Any] = {}

    def observe(self, method: str, path: str, status: int, seconds: float) -> None:
        key = (method, path, status)
        observer = self._observers.get(key)
        if observer is None:
            observer = self.metrics.request_latency.labels(method, path, str(status))
            if len(self._observers) < 1000:
                self._observers[key] = observer
        observer.observe(seconds)


class _LatencyMiddleware:
    """Observes every HTTP request's latency, labelled by route template and status."""

    def __init__(self, app: ASGIApp, latency: _Latency) -> None:
        self.app = app
        self.latency = latency

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

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.latency.observe(scope["method"], path, status, time.perf_counter() - started)


#: The hot routes a gateway calls once per upstream call, answered ahead of the framework too
#: (``billing.api.direct``), after the NUL check: by (method, path); and ``DELETE`` of a path
#: under ``authorizations.RELEASE_PREFIX`` (a hold released: ``serve_release``).
_DIRECT: dict[tuple[str, str], direct.Handle] = {
    ("POST", authorizations.PATH): authorizations.serve_authorization,
    ("GET", credits.BALANCE_PATH): credits.serve_balance,
}


class _App(FastAPI):
    """The FastAPI app, with ``POST /v1/events`` answered ahead of the middleware stack (and
    the routes of ``_DIRECT``, after the NUL check).

    The one route gateways call thousands of times a second goes straight to
    ``events.serve_ingest`` (the same guard, handler and error rendering as the routed endpoint,
    which stays registered for the OpenAPI schema), with its latency observed as for any route:
    the middleware stack, routing, dependency solving and the exception middleware cost more than
    the rest of a single-event post. Any other exception propagates to the server, which answers
    500 (as the error middleware would).
    """

    latency: _Latency
    #: The request limits (``billing.api.limits``), in front of everything, the fast route too.
    limits: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.limits(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == events.PATH
            and scope["method"] == "POST"
            and not scope.get("root_path")
            and not self.root_path
        ):
            scope["app"] = self
            started = time.perf_counter()
            status = 500
            try:
                status = await events.serve_ingest(scope, receive, send, self.state.billing)
            finally:
                self.latency.observe("POST", events.PATH, status, time.perf_counter() - started)
            return
        if scope["type"] == "http":
            nul = _nul_in(scope)
            if nul is not None:
                # PostgreSQL text cannot hold NUL: refuse it here, for every route, as a 422.
                error = ValidationFailed(
                    [FieldError(None, nul, "must not contain NUL characters (%00)")]
                )
                await errors.render(error)(scope, receive, send)
                return
            path = scope["path"]
            handle = _DIRECT.get((scope["method"], path))
            if (
                handle is None
                and scope["method"] == "DELETE"
                and path.startswith(authorizations.RELEASE_PREFIX)
            ):
                # (observed under the route's name, as the framework's routing observes it)
                handle, path = authorizations.serve_release, authorizations.RELEASE_ROUTE
            if handle is not None and not scope.get("root_path") and not self.root_path:
                scope["app"] = self
                started = time.perf_counter()
                answered: int | None = 500
                try:
                    answered = await direct.serve(scope, receive, send, self.state.billing, handle)
                finally:
                    if answered is not None:
                        self.latency.observe(
                            scope["method"], path, answered, time.perf_counter() - started
                        )
                if answered is not None:
                    return
                # handed back (``billing.api.direct.ROUTE``): routed as any other request
        # a budget's webhook URL is checked against the destination policy of these settings
        with destinations.allowing_private(self.state.billing.settings.webhook_allow_private):
            await super().__call__(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        """The schema, with the body models of the routes that read their bodies themselves
        (``billing.api.openapi.request_body``) under ``components``."""
        if self.openapi_schema is None:
            hoist_definitions(super().openapi())
        return self.openapi_schema  # type: ignore[return-value]


def _nul_in(scope: Scope) -> str | None:
    """``"query"`` or ``"path"`` when the request's query string or path holds a NUL character
    (percent-encoded or not), else None."""
    query: bytes = scope.get("query_string", b"")
    if b"%00" in query or b"\x00" in query:
        return "query"
    if "\x00" in scope["path"]:
        return "path"
    return None


def create_app(settings: Settings | None = None, *, background: bool = False) -> FastAPI:
    """Build the app for ``settings`` (the environment's by default).

    The database must already be at the migration head (``billing serve`` and ``billing migrate``
    take care of it). With ``background=True`` the app runs reconciliation passes every
    ``settings.reconcile_interval_s`` seconds while it serves, and delivers the budget alerts'
    webhooks (``billing.budgets.webhooks.DeliveryWorker``).
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

    # BILLING_READ_DATABASE_URL: a replica for the readers (billing.api.state.routed).
    replica = (
        None
        if settings.read_database_url is None
        else make_engine(settings, url=settings.read_database_url)
    )
    state = AppState(
        settings,
        engine,
        sessions,
        Metrics(count_open),
        replica_sessions=None if replica is None else make_sessionmaker(replica),
    )
    state.metrics.registry.register(LedgerCollector(sessions, settings))

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(_last_used_loop(app.state.tokens))]
        if background:
            tasks.append(asyncio.create_task(_reconcile_loop(state)))
            tasks.append(asyncio.create_task(_partitions_loop(state)))
            tasks.append(asyncio.create_task(DeliveryWorker(sessions, settings).run()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            with contextlib.suppress(SQLAlchemyError):
                await asyncio.to_thread(app.state.tokens.flush_last_used)
            if state.ingest_writer is not None:
                state.ingest_writer.close()
            engine.dispose()
            if replica is not None:
                replica.dispose()

    app = _App(
        title="billing",
        version="1",
        summary="Streaming usage and billing accounting for LLM API gateways",
        lifespan=lifespan,
        # /docs is served from the package's own Swagger UI files (billing.console.docs).
        docs_url=None,
        redoc_url=None,
    )
    app.state.billing = state
    app.state.tokens = TokenCache(sessions)
    app.limits = RequestLimits(
        app._dispatch,
        settings,
        lambda: app.state.tokens,
        body_limits={events.PATH: MAX_BODY_BYTES, providers.PATH: MAX_REPORT_BYTES},
        gzip_paths=frozenset({events.PATH}),
        form_paths=FORM_PATHS,
    )
    errors.install(app, settings.db_retry_after_s)
    for module in _ROUTERS:
        app.include_router(module.router)
    install_console(app)
    limits.declare(app.routes)
    app.latency = _Latency(state.metrics)
    app.add_middleware(_LatencyMiddleware, latency=app.latency)
    return app


_ROUTERS: list[Any] = [
    events,
    calls,
    usage,
    prices,
    plans,
    keys,
    reconcile,
    health,
    exports,
    providers,
    drift,
    tokens_api,
    schema,
    budgets,
    authorizations,
    credits,
]


async def _reconcile_loop(state: AppState) -> None:
    """Background passes; a failed pass is logged and retried at the next interval, a database
    outage in one line with a growing pause (``billing.reconcile.runner.Backoff``). While this
    app's ingest is writing, the passes take short steps (``run_pass``'s ``busy``)."""

    def busy() -> bool:
        writer = state.ingest_writer
        return writer is not None and writer.busy()

    backoff = Backoff(state.settings.reconcile_interval_s)
    while True:
        await asyncio.sleep(backoff.pause_s)
        try:
            await asyncio.to_thread(
                run_pass, state.sessions, state.settings, state.metrics, None, busy
            )
        except Exception as error:
            if not backoff.failed(error):
                log.exception("background reconciliation pass failed; retrying next interval")
        else:
            backoff.succeeded()


async def _partitions_loop(state: AppState) -> None:
    """``events``' months made ahead at start and every ``MAINTENANCE_EVERY_S``
    (``billing.ingest.partitions``); a failure is logged and tried again at the next look."""
    while True:
        try:
            made = await asyncio.to_thread(make_partitions_ahead, state.sessions, datetime.now(UTC))
        except SQLAlchemyError as error:
            log.warning("could not make the events' partitions ahead (%s); retrying", error)
        else:
            if made:
                log.info("events partitions made: %s", ", ".join(f"{y}-{m:02d}" for y, m in made))
        await asyncio.sleep(MAINTENANCE_EVERY_S)


async def _last_used_loop(tokens: TokenCache) -> None:
    """Writes the tokens' ``last_used_at`` once a minute (``TokenCache.flush_last_used``)."""
    while True:
        await asyncio.sleep(LAST_USED_EVERY_S)
        try:
            await asyncio.to_thread(tokens.flush_last_used)
        except SQLAlchemyError as error:
            log.warning("could not write the tokens' last use (%s); retrying", type(error).__name__)
