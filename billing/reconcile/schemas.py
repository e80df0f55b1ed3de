"""The shapes of the reconciler's answers (CONTRACT "Cost")."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PassReply(BaseModel):
    """``POST /v1/reconcile``: calls examined, newly settled, and adjustment entries written by
    the pass."""

    model_config = ConfigDict(extra="forbid")

    examined: int = Field(ge=0)
    settled: int = Field(ge=0)
    adjusted: int = Field(ge=0)
