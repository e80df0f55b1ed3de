"""The bodies of the admin token API (``GET/POST/DELETE /v1/tokens``): a token is shown with its
secret once, in the answer that creates it, and never again."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from billing.auth.tokens import Role, TokenInfo
from billing.fields import Timestamp, printable
from billing.timefmt import rfc3339


class TokenIn(BaseModel):
    """``POST /v1/tokens``: the new token's role, an optional name, and an optional time at
    which it stops working (RFC 3339, in the future; none: until revoked)."""

    model_config = ConfigDict(extra="forbid")

    role: Role
    name: (
        Annotated[str, StringConstraints(min_length=1, max_length=128), AfterValidator(printable)]
        | None
    ) = None
    expires_at: Timestamp | None = None


class TokenOut(BaseModel):
    """A stored token without its secret; times RFC 3339 UTC, null when not (yet) so."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(examples=["tok_3f9a1c2b4d5e"])
    name: str | None
    role: Role
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None = Field(description="to the minute: written once a minute")


class CreatedToken(TokenOut):
    """The token just created, with its secret (``token``): shown this once only."""

    token: str = Field(description="the bearer token; it is not stored and never shown again")


class TokenList(BaseModel):
    """``GET /v1/tokens``: every token (revoked and expired ones too), oldest first."""

    model_config = ConfigDict(extra="forbid")

    data: list[TokenOut]


def token_json(info: TokenInfo) -> dict[str, Any]:
    """A token's ``TokenOut`` as JSON (never its secret, which is not stored)."""
    return {
        "id": info.id,
        "name": info.name,
        "role": info.role,
        "created_at": rfc3339(info.created_at),
        "expires_at": rfc3339(info.expires_at),
        "revoked_at": rfc3339(info.revoked_at),
        "last_used_at": rfc3339(info.last_used_at),
    }
