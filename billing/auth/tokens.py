"""API tokens: created once and shown once, stored as SHA-256 hashes, revocable.

A token is 32 random bytes (``secrets.token_urlsafe``) behind the prefix ``bt_``; with that much
entropy a plain SHA-256 is a safe hash (no password stretching needed), and lookups go by hash.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from billing.errors import NotFound
from billing.storage.models import ApiToken

Role = Literal["ingest", "read", "export", "admin"]
ROLES: tuple[str, ...] = get_args(Role)
TOKEN_PREFIX = "bt_"


@dataclass(frozen=True)
class TokenInfo:
    """A stored token without its secret: id, name, role, creation and revocation times."""

    id: str
    name: str | None
    role: str
    created_at: datetime
    revoked_at: datetime | None


def hash_token(token: str) -> str:
    """SHA-256 hex digest of a presented token."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    session: Session, role: str, name: str | None, now: datetime
) -> tuple[str, TokenInfo]:
    """Create a token for ``role``; returns ``(secret, info)``. The secret is not stored.

    Raises ``ValueError`` for an unknown role.
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = "tok_" + secrets.token_hex(6)
    row = ApiToken(id=token_id, name=name, role=role, token_hash=hash_token(secret), created_at=now)
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


def role_of(session: Session, presented: str) -> str | None:
    """The role of a presented token, or None when it is unknown or revoked.

    The stored hash is compared in constant time after the indexed lookup.
    """
    digest = hash_token(presented)
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(row.token_hash, digest):
        return None
    return row.role


def _info(row: ApiToken) -> TokenInfo:
    return TokenInfo(row.id, row.name, row.role, row.created_at, row.revoked_at)
