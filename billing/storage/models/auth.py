"""Bearer tokens (CONTRACT "Who may do what")."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from billing.storage.models.base import (
    Base,
)
from billing.storage.types import UTCDateTime


class ApiToken(Base):
    """An API token (CONTRACT "Who may do what"): one role, stored only as a SHA-256 hash."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    token_hash: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: The token stops working at this time (None: never).
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: When the token was last presented, to the minute (``billing.auth.guard.TokenCache``).
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
