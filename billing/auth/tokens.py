"""API tokens: created once and shown once, stored as SHA-256 hashes, revocable.

A token is 32 random bytes (``secrets.token_urlsafe``) behind the prefix ``bt_``; with that much
entropy a plain SHA-256 is a safe hash (no password stretching needed), and lookups go by hash.
A token may expire (``expires_at``: it then stops working as if revoked); ``last_used_at`` is
kept to the minute (``billing.auth.guard.TokenCache`` writes it, at most once a minute).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from billing.errors import NotFound
from billing.secret_ids import TOKEN_PREFIX
from billing.storage.models import ApiToken

Role = Literal["ingest", "read", "export", "admin"]
ROLES: tuple[str, ...] = get_args(Role)


@dataclass(frozen=True)
class TokenInfo:
    """A stored token without its secret: id, name, role, creation, revocation and expiry
    times, and when it was last used (to the minute; None: never)."""

    id: str
    name: str | None
    role: str
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None = None
    last_used_at: datetime | None = None

    def active(self, now: datetime) -> bool:
        """Neither revoked nor expired at ``now``."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


def hash_token(token: str) -> str:
    """SHA-256 hex digest of a presented token."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    session: Session,
    role: str,
    name: str | None,
    now: datetime,
    expires_at: datetime | None = None,
) -> tuple[str, TokenInfo]:
    """Create a token for ``role``, working until ``expires_at`` (None: until revoked); returns
    ``(secret, info)``. The secret is not stored.

    Raises ``ValueError`` for an unknown role or an ``expires_at`` not after ``now``.
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
    if expires_at is not None and expires_at <= now:
        raise ValueError("the expiry must be in the future")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = "tok_" + secrets.token_hex(6)
    row = ApiToken(
        id=token_id,
        name=name,
        role=role,
        token_hash=hash_token(secret),
        created_at=now,
        expires_at=expires_at,
    )
    session.add(row)
    session.flush()
    return secret, _info(row)


def list_tokens(session: Session) -> list[TokenInfo]:
    """Every token (revoked ones too), oldest first."""
    return [_info(t) for t in session.scalars(select(ApiToken).order_by(ApiToken.created_at))]


def revoke_token(session: Session, token_id: str, now: datetime) -> TokenInfo:
    """Revoke a token by id (idempotent). Raises ``NotFound`` for an unknown id."""
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound(f"no token with id {token_id!r}; `billing tokens list` shows the ids")
    if row.revoked_at is None:
        session.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked_at=now))
        row.revoked_at = now
    return _info(row)


def token_count(session: Session) -> int:
    """How many tokens were ever created, revoked ones included.

    0 means no access control is configured: the server then runs unauthenticated, on loopback
    only. Once a token exists the service never falls back to open access, even when every token
    is revoked (revoking the last token must lock the service, not open it).
    """
    return int(session.scalar(select(func.count()).select_from(ApiToken)) or 0)


def find_token(session: Session, presented: str) -> TokenInfo | None:
    """The stored token a presented secret is, revoked or expired ones too (``active`` says);
    None when it is unknown. The stored hash is compared in constant time after the indexed
    lookup."""
    digest = hash_token(presented)
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        return None
    return _info(row)


def role_of(session: Session, presented: str, now: datetime) -> str | None:
    """The role of a presented token, or None when it is unknown, revoked or expired."""
    info = find_token(session, presented)
    return info.role if info is not None and info.active(now) else None


def record_use(session: Session, used: Mapping[str, datetime]) -> None:
    """Set ``last_used_at`` of each token id in ``used`` (one UPDATE per token)."""
    for token_id, when in used.items():
        session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=when))


def _info(row: ApiToken) -> TokenInfo:
    return TokenInfo(
        row.id,
        row.name,
        row.role,
        row.created_at,
        row.revoked_at,
        row.expires_at,
        row.last_used_at,
    )
