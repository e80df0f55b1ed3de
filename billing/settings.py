"""Service settings, read from the environment with the prefix ``BILLING_``."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of the service; each field maps to ``BILLING_<NAME>``.

    - ``database_url``: SQLAlchemy URL; a SQLite file ``billing.db`` in the working directory by
      default, ``postgresql+psycopg://user@host/db`` for PostgreSQL (CONTRACT "Operations").
    - ``settle_after_s``: seconds without a new event after which a call settles on what it has
      (CONTRACT "Reconciliation", default 300).
    - ``close_lag_s``: seconds after ``until`` before an export period counts as closed
      (CONTRACT "Export", default 60).
    - ``reconcile_interval_s``: seconds between background reconciliation passes in ``serve``.
    - ``reconcile_batch_size``: calls per reconciliation step (one transaction). A pass takes
      what is due in steps of this size, so it only matters when calls wait in numbers (a
      backlog, a new price): larger steps spread each commit and the rollup rows over more
      calls and hold the step's locks longer (SQLite's one write lock: ingest waits for it;
      bench/README.md, ``reconcile.py``, has the measurements).
    - ``reconcile_threads``: steps a PostgreSQL pass runs at once, each on its own calls (one
      waits for the database while another computes); SQLite runs one (it has one writer).
    - ``sqlite_busy_timeout_ms``: how long a SQLite writer waits for the lock before giving up.
    - ``db_retry_after_s``: the ``Retry-After`` value sent with a 503 when the database is down.
    - ``db_statement_timeout_s``: the longest a database statement may run: PostgreSQL's
      ``statement_timeout``, and on both databases the deadline after which a statement that
      gets no answer (a database host gone silent) has its connection closed, failing as an
      outage (503) instead of holding the request (``billing.storage.db``).
    - ``body_timeout_s``: a request body must arrive in full within this many seconds (408).
    - ``max_body_bytes``: the largest request body of every route but ``POST /v1/events``
      (whose limit is the contract's 1 MiB) (413).
    - ``max_header_bytes``: the largest request line and headers together (431).
    - ``header_timeout_s``: a connection must send a request's headers in full within this many
      seconds of opening (or of starting that request), or it is closed (408).
    - ``keep_alive_s``: an idle connection between requests is closed after this many seconds.
    - ``webhook_retry_s``: a budget alert's webhook is retried (exponential backoff with jitter)
      for this many seconds after the alert, then marked failed (CONTRACT "Budgets and alerts
      (v2)", default 24 h).
    - ``webhook_timeout_s``: the deadline of one webhook delivery attempt, whole: resolving,
      connecting, sending and reading the reply (default 10 s).
    - ``webhook_concurrency``: webhook deliveries in flight at once (default 16).
    - ``webhook_allow_private``: allow webhook URLs whose host is (or resolves to) a loopback,
      private, link-local, metadata or multicast address (default false: refused;
      ``billing.destinations``).
    - ``forwarded_allow_ips``: the proxies (addresses, comma-separated, or ``*``) whose
      ``X-Forwarded-Proto``/``X-Forwarded-For`` are trusted (uvicorn's ``proxy_headers``); the
      console cookie is ``Secure`` when the client's scheme is https.
    - ``min_free_disk_bytes``: ``/readyz`` answers 503 "disk full" when less than this is free
      beside a SQLite database (default 32 MiB; its writes fail when the disk is full).
    - ``cookie_secure``: always mark the console cookie ``Secure`` (default false: when the
      request's scheme is https).
    - ``webhook_poll_s``: seconds between the delivery worker's looks at the outbox.
    - ``metrics_max_budgets``: ``/metrics`` reports the remaining amount of at most this many
      budgets in force, the first by ``budget_id`` (CONTRACT "Observability (v3)").
    - ``metrics_max_models``: ``/metrics`` labels at most this many models (those of the
      highest cost); the others are summed under ``model="_other"``.
    """

    model_config = SettingsConfigDict(env_prefix="BILLING_", extra="ignore")

    database_url: str = "sqlite:///billing.db"
    read_database_url: str | None = None
    settle_after_s: float = Field(default=300.0, gt=0)
    close_lag_s: float = Field(default=60.0, ge=0)
    reconcile_interval_s: float = Field(default=2.0, gt=0)
    reconcile_batch_size: int = Field(default=4000, ge=1, le=100_000)
    reconcile_threads: int = Field(default=2, ge=1, le=16)
    sqlite_busy_timeout_ms: int = Field(default=10_000, ge=0)
    db_pool_size: int = Field(default=10, ge=1)
    db_retry_after_s: int = Field(default=2, ge=1)
    db_statement_timeout_s: float = Field(default=15.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    max_header_bytes: int = Field(default=32 * 1024, ge=1024)
    header_timeout_s: float = Field(default=10.0, gt=0)
    keep_alive_s: float = Field(default=5.0, gt=0)
    webhook_retry_s: float = Field(default=86_400.0, gt=0)
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    webhook_poll_s: float = Field(default=1.0, gt=0)
    webhook_concurrency: int = Field(default=16, ge=1, le=1024)
    webhook_allow_private: bool = False
    forwarded_allow_ips: str | None = None
    cookie_secure: bool = False
    min_free_disk_bytes: int = Field(default=32 << 20, ge=0)
    metrics_max_budgets: int = Field(default=100, ge=0, le=10_000)
    metrics_max_models: int = Field(default=100, ge=1, le=10_000)
    log_level: str = "info"

    @field_validator("database_url", "read_database_url")
    @classmethod
    def _known_database(cls, value: str | None) -> str | None:
        if value is None:
            return None
        for plain in ("postgresql://", "postgres://"):
            if value.startswith(plain):
                # psycopg 3 is the driver we ship; a bare postgresql:// would ask for psycopg2.
                value = "postgresql+psycopg://" + value[len(plain) :]
        if not (value.startswith("sqlite") or value.startswith("postgresql+psycopg")):
            raise ValueError(
                "must be a sqlite:///PATH or postgresql+psycopg://USER@HOST/DB URL, "
                f"not {value.split(':', 1)[0]!r}"
            )
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        levels = {"critical", "error", "warning", "info", "debug"}
        if value.lower() not in levels:
            raise ValueError(f"must be one of {', '.join(sorted(levels))}")
        return value.lower()


class SettingsError(Exception):
    """A setting in the environment is invalid; ``str()`` is one line naming it."""


def describe_error(error: ValidationError) -> str:
    """Turn a settings ``ValidationError`` into one line: ``BILLING_X: reason; …``."""
    parts = []
    for item in error.errors():
        name = "BILLING_" + str(item["loc"][0]).upper() if item["loc"] else "settings"
        parts.append(f"{name}: {item['msg']}")
    return "invalid setting " + "; ".join(parts)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once.

    Raises ``SettingsError`` with one clear line when a value is invalid.
    """
    try:
        return Settings()
    except ValidationError as error:
        raise SettingsError(describe_error(error)) from None
