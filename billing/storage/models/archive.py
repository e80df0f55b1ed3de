"""(v3) The archive's tables: the months of events moved out of the database, and the settled
calls left as they were while events of theirs are away (``billing.archive``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from billing.storage.models.base import Base
from billing.storage.types import UTCDateTime


class MonthArchive(Base):
    """(v3) A month of events (``occurred_at`` in ``[month_start, month_end)``) that
    ``billing archive`` moved to ``file``, at ``archived_at``; removed by its restore, in the
    same transactions as the events. The reconciler reads it to know which settled calls may
    have events away (``ParkedCall``)."""

    __tablename__ = "archived_months"

    month_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    month_end: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    archived_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    file: Mapped[str] = mapped_column(String(64), nullable=False)


class ParkedCall(Base):
    """(v3) A settled call made pending (a late event, a re-rating) while some of its events
    are archived: the reconciler leaves its figures and ledger as they were instead of
    rebuilding it from the events still stored, and the restore of a month makes every parked
    call pending again (``billing.reconcile.service``, ``billing.archive.service``)."""

    __tablename__ = "parked_calls"

    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    parked_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
