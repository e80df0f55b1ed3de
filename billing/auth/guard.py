"""The request guard: which roles may call an endpoint, checked against the bearer token.

Source: CONTRACT "Who may do what". ``admin`` may call everything. Until the first token is
created the service is open (and ``billing serve`` then listens on loopback only). Answers are
cached for a couple of seconds so the ingest path does not query the token table on every
request; a revoked (or expired) token stops working within that time.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from billing.auth.tokens import TokenInfo, find_token, hash_token, record_use, token_count
from billing.errors import Forbidden, Unauthorized
from billing.storage.db import is_unavailable, write_transaction

CACHE_TTL_S = 2.0
#: The ASGI scope key of the role of the token that ``billing.api.limits.RequestLimits`` admitted
#: (it checks the token of every request with a body before reading it); ``allow`` takes it
#: from there instead of looking the token up again.
ADMITTED_ROLE = "billing.role"
#: While the database is unavailable, a token seen before is not looked up again for this long.
UNAVAILABLE_RETRY_S = 10.0
#: A token's ``last_used_at`` is written at most this often (seconds): not a write per request.
LAST_USED_EVERY_S = 60.0

#: The bearer scheme as OpenAPI declares it on every guarded route. It never refuses a request
#: itself (``auto_error=False``): the guard reads the header and answers 401/403 in its words.
BEARER = HTTPBearer(
    scheme_name="bearer",
    description=(
        "An API token (`billing tokens create --role ROLE`) sent as 'Authorization: Bearer "
        "<token>'. Until the first token is created the service is open."
    ),
    auto_error=False,
)
#: A guard's parameter that declares ``BEARER`` (FastAPI passes the parsed header; unused).
DeclaresBearer = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]


class TokenCache:
    """Short-lived cache of "is any token configured" and "token hash → stored token", and the
    tokens' ``last_used_at`` waiting to be written.

    Once a token exists the answer to ``auth_enabled`` never changes (tokens are revoked, never
    deleted), so it is then kept for good; until then it is asked again every ``ttl_s``. The
    ``cached_*`` methods never touch the database; async code (the ``billing.api.limits``
    middleware, the console) calls the ``*_async`` ones, which look a miss up in the thread
    pool, once for all the requests waiting for the same answer. A token's use
    is noted in memory, at most once per ``LAST_USED_EVERY_S`` per token, and written by
    ``flush_last_used`` (the app's background task, ``GET /v1/tokens``).
    """

    def __init__(self, sessions: sessionmaker[Session], ttl_s: float = CACHE_TTL_S) -> None:
        self._sessions = sessions
        self._ttl = ttl_s
        self._lock = threading.Lock()
        self._count: tuple[float, int] | None = None
        self._roles: dict[str, tuple[float, TokenInfo | None]] = {}
        self._noted: dict[str, float] = {}
        self._unwritten: dict[str, datetime] = {}
        # The lookups under way, per event loop, by what is looked up: when a cached answer
        # expires, the requests that arrive while the database is asked wait for that one
        # answer instead of each asking again in a thread of its own.
        self._lookups: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str | None, asyncio.Future[Any]]
        ] = weakref.WeakKeyDictionary()
        self._unavailable_until = 0.0

    def cached_auth_enabled(self) -> bool | None:
        """``auth_enabled()`` when known without the database, else None."""
        cached = self._count  # read without the lock: replaced whole, never changed in place
        if cached is None:
            return None
        if cached[1] > 0:
            return True
        return False if time.monotonic() - cached[0] < self._ttl else None

    def auth_enabled(self) -> bool:
        """True once any token has been created (see ``token_count``)."""
        known = self.cached_auth_enabled()
        if known is not None:
            return known
        now = time.monotonic()
        before = self._count
        if before is not None and now < self._unavailable_until:
            return before[1] > 0
        try:
            with self._sessions() as session:
                count = token_count(session)
        except SQLAlchemyError as error:
            if before is None or not is_unavailable(error):
                raise
            self._unavailable_until = now + UNAVAILABLE_RETRY_S
            return before[1] > 0
        with self._lock:
            self._count = (now, count)
        return count > 0

    def cached_role(self, presented: str) -> tuple[bool, str | None]:
        """``(True, role(presented))`` when the answer is cached, else ``(False, None)``."""
        hit = self._roles.get(hash_token(presented))  # a dict read is atomic
        if hit is None or time.monotonic() - hit[0] >= self._ttl:
            return False, None
        return True, self._role(hit[1])

    async def auth_enabled_async(self) -> bool:
        """``auth_enabled()`` for async code: the cached answer, else the lookup on a worker
        thread (the event loop never waits on the database)."""
        known = self.cached_auth_enabled()
        if known is not None:
            return known
        enabled: bool = await self._lookup(None, self.auth_enabled)
        return enabled

    async def role_async(self, presented: str) -> str | None:
        """``role(presented)`` for async code: the cached answer, else the lookup on a worker
        thread."""
        known, role = self.cached_role(presented)
        if known:
            return role
        found: str | None = await self._lookup(presented, self.role, presented)
        return found

    async def _lookup(self, key: str | None, ask: Callable[..., Any], *args: Any) -> Any:
        """``ask(*args)`` in the thread pool, once for all the requests that want ``key`` (a
        presented token; None: whether any token exists) at the same time."""
        lookups = self._lookups.setdefault(asyncio.get_running_loop(), {})
        pending = lookups.get(key)
        if pending is None:
            pending = asyncio.ensure_future(run_in_threadpool(ask, *args))
            lookups[key] = pending

            def done(future: asyncio.Future[Any]) -> None:
                lookups.pop(key, None)
                if not future.cancelled():
                    future.exception()  # retrieved here too: its waiters may all have left

            pending.add_done_callback(done)
        # Shielded: a request whose client hangs up does not cancel the others' answer.
        return await asyncio.shield(pending)

    def role(self, presented: str) -> str | None:
        """The role of a presented token (None: unknown, revoked or expired)."""
        known, role = self.cached_role(presented)
        if known:
            return role
        stale = self._roles.get(hash_token(presented))
        now = time.monotonic()
        if stale is not None and now < self._unavailable_until:
            return self._role(stale[1])
        try:
            with self._sessions() as session:
                info = find_token(session, presented)
        except SQLAlchemyError as error:
            # While the database is away a token known before keeps its answer (nothing can be
            # revoked meanwhile), and the database is not asked again for a while: a request
            # must not wait for the database's deadline to learn what it knew a second ago.
            if stale is None or not is_unavailable(error):
                raise
            self._unavailable_until = now + UNAVAILABLE_RETRY_S
            return self._role(stale[1])
        with self._lock:
            if len(self._roles) > 10_000:
                self._roles.clear()
            self._roles[hash_token(presented)] = (now, info)
        return self._role(info)

    def _role(self, info: TokenInfo | None) -> str | None:
        if info is None:
            return None
        now = datetime.now(UTC)
        if not info.active(now):
            return None
        ticks = time.monotonic()
        if ticks - self._noted.get(info.id, -LAST_USED_EVERY_S) >= LAST_USED_EVERY_S:
            with self._lock:
                self._noted[info.id] = ticks
                self._unwritten[info.id] = now
        return info.role

    def flush_last_used(self) -> int:
        """Write the noted ``last_used_at`` values; returns how many tokens were written. A
        failed write keeps them for the next flush."""
        with self._lock:
            unwritten, self._unwritten = self._unwritten, {}
        if not unwritten:
            return 0
        try:
            with write_transaction(self._sessions) as session:
                record_use(session, unwritten)
        except BaseException:
            with self._lock:
                self._unwritten = {**unwritten, **self._unwritten}
            raise
        return len(unwritten)


def bearer(authorization: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; 401 (``Unauthorized``) when
    there is none."""
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise Unauthorized(
            "this endpoint needs a bearer token: send 'Authorization: Bearer <token>' "
            "(create one with `billing tokens create --role ROLE`)"
        )
    return presented.strip()


def known_role(role: str | None) -> str:
    """``role``, or 401 when the token had none (unknown, revoked or expired)."""
    if role is None:
        raise Unauthorized("the bearer token is unknown, revoked or expired")
    return role


def allow(*roles: str) -> Callable[..., None]:
    """A dependency that lets ``roles`` (and ``admin``) through; 401/403 otherwise."""
    allowed = frozenset(roles) | {"admin"}

    def guard(request: Request, _declared: DeclaresBearer = None) -> None:
        role: str | None = request.scope.get(ADMITTED_ROLE)
        if role is None:
            cache: TokenCache = request.app.state.tokens
            if not cache.auth_enabled():
                return
            presented = bearer(request.headers.get("authorization", ""))
            role = known_role(cache.role(presented))
        if role not in allowed:
            raise Forbidden(
                f"a token with role {role!r} may not call this endpoint; "
                f"allowed roles: {', '.join(sorted(allowed))}"
            )

    guard.allowed_roles = allowed  # type: ignore[attr-defined]
    return guard
