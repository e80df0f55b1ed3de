"""The request guard: which roles may call an endpoint, checked against the bearer token.

Source: CONTRACT "Who may do what". ``admin`` may call everything. Until the first token is
created the service is open (and ``billing serve`` then listens on loopback only). Answers are
cached for a couple of seconds so the ingest path does not query the token table on every
request; a revoked token stops working within that time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from billing.auth.tokens import hash_token, role_of, token_count
from billing.errors import Forbidden, Unauthorized

CACHE_TTL_S = 2.0

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
    """Short-lived cache of "how many active tokens" and "token hash → role"."""

    def __init__(self, sessions: sessionmaker[Session], ttl_s: float = CACHE_TTL_S) -> None:
        self._sessions = sessions
        self._ttl = ttl_s
        self._lock = threading.Lock()
        self._count: tuple[float, int] | None = None
        self._roles: dict[str, tuple[float, str | None]] = {}

    def auth_enabled(self) -> bool:
        """True once any token has been created (see ``token_count``)."""
        now = time.monotonic()
        cached = self._count  # read without the lock: replaced whole, never changed in place
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1] > 0
        with self._sessions() as session:
            count = token_count(session)
        with self._lock:
            self._count = (now, count)
        return count > 0

    def role(self, presented: str) -> str | None:
        """The role of a presented token (None: unknown or revoked)."""
        key = hash_token(presented)
        now = time.monotonic()
        hit = self._roles.get(key)  # a dict read is atomic; writers hold the lock
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        with self._sessions() as session:
            role = role_of(session, presented)
        with self._lock:
            if len(self._roles) > 10_000:
                self._roles.clear()
            self._roles[key] = (now, role)
        return role


def allow(*roles: str) -> Callable[..., None]:
    """A dependency that lets ``roles`` (and ``admin``) through; 401/403 otherwise."""
    allowed = frozenset(roles) | {"admin"}

    def guard(request: Request, _declared: DeclaresBearer = None) -> None:
        cache: TokenCache = request.app.state.tokens
        if not cache.auth_enabled():
            return
        header = request.headers.get("authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise Unauthorized(
                "this endpoint needs a bearer token: send 'Authorization: Bearer <token>' "
                "(create one with `billing tokens create --role ROLE`)"
            )
        role = cache.role(presented.strip())
        if role is None:
            raise Unauthorized("the bearer token is unknown or revoked")
        if role not in allowed:
            raise Forbidden(
                f"a token with role {role!r} may not call this endpoint; "
                f"allowed roles: {', '.join(sorted(allowed))}"
            )

    guard.allowed_roles = allowed  # type: ignore[attr-defined]
    return guard
