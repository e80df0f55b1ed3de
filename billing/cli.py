"""The ``billing`` command line (typer); every command reads the same settings as the server."""

from __future__ import annotations

import copy
import errno
import hashlib
import ipaddress
import json
import logging.config
import os
import socket
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import uvicorn
from pydantic import ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from uvicorn.config import LOGGING_CONFIG

from billing.auth.tokens import create_token, list_tokens, revoke_token, token_count
from billing.errors import BillingError, ValidationFailed
from billing.export.params import KINDS, parse_params
from billing.export.service import ExportStats, count_entries, export_chunks, period_label
from billing.pricing.schemas import PriceIn
from billing.pricing.service import record_price
from billing.reconcile.runner import run_pass
from billing.replay import DEFAULT_URL, ReplayError, fetch_call
from billing.replay import replay as replay_stream
from billing.settings import Settings, SettingsError, get_settings
from billing.storage.db import make_engine, make_sessionmaker, read_transaction, write_transaction
from billing.storage.migrate import upgrade_to_head
from billing.timefmt import rfc3339

app = typer.Typer(
    help="Streaming usage and billing accounting for LLM API gateways.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one clear line to standard error and exit non-zero."""
    typer.echo(f"billing: {message}", err=True)
    raise typer.Exit(code)


def load_settings() -> Settings:
    """The settings, or exit 2 with one line naming the bad setting."""
    try:
        return get_settings()
    except SettingsError as error:
        fail(str(error), 2)


def migrate_or_fail(settings: Settings) -> None:
    """Bring the database to the migration head, or exit 1 with one line saying why."""
    try:
        upgrade_to_head(settings.database_url)
    except SQLAlchemyError as error:
        reason = str(getattr(error, "orig", error)).strip().splitlines()[0]
        fail(f"cannot migrate the database at {_safe(settings.database_url)}: {reason}")


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback name or address (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback  # serve takes the brackets off
    except ValueError:
        return False


def _authority(host: str, port: int) -> str:
    """``host:port`` as a URL writes it (an IPv6 address in brackets)."""
    try:
        ipv6 = ipaddress.ip_address(host).version == 6
    except ValueError:
        ipv6 = False
    return f"[{host}]:{port}" if ipv6 else f"{host}:{port}"


def _cannot_listen(host: str, port: int, dual_stack: bool = False) -> str | None:
    """Why ``host``:``port`` cannot be listened on now, as one sentence, or None when it can.

    Every address ``host`` resolves to is bound and released at once, with ``SO_REUSEADDR`` as
    uvicorn binds, so ``billing serve`` says so in one line before it migrates or announces
    itself (uvicorn would report it after its startup). A port in use gets a hint; other errors
    are the operating system's words. ``dual_stack``: an IPv6 socket also takes IPv4, as uvicorn
    binds with more than one worker (with one, asyncio binds IPv6 only).
    """
    where = _authority(host, port)
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, UnicodeError) as error:
        return f"cannot listen on {where}: cannot resolve {host!r} ({error})"
    for family, kind, proto, _name, address in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
            try:
                sock.bind(address)
            except OSError as error:
                reason = error.strerror or str(error)
                if error.errno == errno.EADDRINUSE:
                    return (
                        f"cannot listen on {where}: {reason} (another server holds the port? "
                        "choose another with --port)"
                    )
                return f"cannot listen on {where}: {reason}"
    return None


def _safe(url: str) -> str:
    """The URL without a password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}@{host}"
    return url


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 8000,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes.")] = 1,
) -> None:
    """Apply migrations, then serve the HTTP API with uvicorn (reconciling in the background)."""
    settings = load_settings()
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address as a URL writes it
        host = host[1:-1]
    reason = _cannot_listen(host, port, dual_stack=workers > 1)
    if reason is not None:
        fail(reason)
    migrate_or_fail(settings)
    with read_transaction(_open(settings)) as session:
        tokens = token_count(session)
    if tokens == 0:
        if not _is_loopback(host):
            fail(
                f"refusing to listen on {host} without API tokens: create one with "
                "`billing tokens create --role admin`, or listen on 127.0.0.1"
            )
        typer.echo(
            "billing: no API tokens configured: serving UNAUTHENTICATED on loopback only "
            "(create one with `billing tokens create --role admin`)",
            err=True,
        )
    where = _authority(host, port)
    typer.echo(
        f"billing: serving on http://{where} with database {_safe(settings.database_url)}",
        err=True,
    )
    uvicorn.run(
        "billing.cli:server_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        **uvicorn_options(settings.log_level),
    )


#: The GIL switch interval of a ``billing serve`` process, in seconds (Python's default: 0.005).
SWITCH_INTERVAL_S = 0.0001


def server_app() -> object:
    """The ASGI app of ``billing serve`` (``billing.api.server:app``), loaded in each worker.

    The heap built at start (modules, the app, validators: hundreds of thousands of objects that
    live as long as the process) is moved out of the cyclic garbage collector's reach with
    ``gc.freeze()``: otherwise every full collection walks it again, an ~80 ms pause that lands
    in the acknowledgement latency of ingest several times a second under load.

    The interpreter's switch interval is lowered to ``SWITCH_INTERVAL_S``: the ingest writer
    thread hands the GIL over while SQLite runs each statement and its commit, and when one ends
    it waits for the GIL until the event loop's thread, busy validating posts, is asked to let go
    (after the switch interval, 5 ms by default). Batches of 100 on SQLite: ≈ 20,000 → ≈ 23,500
    events/s, with the writer's statements taking ≈ 20 instead of ≈ 31 µs an event (bench/README).
    """
    import gc

    from billing.api.server import app as server

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.collect()
    gc.freeze()
    return server


def log_config(log_level: str) -> dict[str, Any]:
    """uvicorn's logging configuration plus the ``billing`` loggers at ``log_level``, on stderr
    with time, level and logger name (without it, Python shows only their warnings)."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["billing"] = {
        "format": "%(asctime)s %(levelname)s %(name)s: %(message)s",
    }
    config["handlers"]["billing"] = {
        "class": "logging.StreamHandler",
        "formatter": "billing",
        "stream": "ext://sys.stderr",
    }
    config["loggers"]["billing"] = {
        "handlers": ["billing"],
        "level": log_level.upper(),
        "propagate": False,
    }
    return config


def configure_logging(log_level: str) -> None:
    """Send the ``billing`` loggers to stderr at ``log_level`` (commands run without uvicorn)."""
    logging.config.dictConfig(log_config(log_level))


def uvicorn_options(log_level: str) -> dict[str, Any]:
    """The uvicorn settings of ``billing serve`` (also used by bench/ingest.py's HTTP ceiling).

    uvloop and httptools when installed (``uvicorn[standard]`` brings both), no access log, no
    proxy headers, no ``Server`` header.
    """
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:  # pragma: no cover - uvicorn[standard] ships it
        loop = "asyncio"
    try:
        import httptools  # noqa: F401

        http = "httptools"
    except ImportError:  # pragma: no cover
        http = "h11"
    return {
        "log_level": log_level,
        "log_config": log_config(log_level),
        "access_log": False,
        "proxy_headers": False,
        "server_header": False,
        "loop": loop,
        "http": http,
    }


@app.command()
def migrate() -> None:
    """Bring the database to the newest schema (Alembic upgrade to head)."""
    settings = load_settings()
    migrate_or_fail(settings)
    typer.echo(f"billing: database at migration head ({_safe(settings.database_url)})", err=True)


tokens_app = typer.Typer(
    help="API tokens (roles: ingest, read, export, admin).", no_args_is_help=True
)
app.add_typer(tokens_app, name="tokens")


@tokens_app.command("create")
def tokens_create(
    role: Annotated[str, typer.Option(help="ingest, read, export or admin.")],
    name: Annotated[str | None, typer.Option(help="A label to recognise the token by.")] = None,
) -> None:
    """Create a token; prints the token (once) on stdout and its id on stderr."""
    settings = load_settings()
    migrate_or_fail(settings)
    try:
        with write_transaction(_open(settings)) as session:
            secret, info = create_token(session, role, name, datetime.now(UTC))
    except ValueError as error:
        fail(str(error), 2)
    typer.echo(secret)
    typer.echo(
        f"billing: created token {info.id} (role {info.role}); it is shown only once", err=True
    )


@tokens_app.command("list")
def tokens_list() -> None:
    """List tokens (id, role, name, created, revoked); secrets are never shown."""
    settings = load_settings()
    migrate_or_fail(settings)
    with read_transaction(_open(settings)) as session:
        for info in list_tokens(session):
            revoked = rfc3339(info.revoked_at) or "active"
            typer.echo(
                f"{info.id}\t{info.role}\t{info.name or '-'}\t{rfc3339(info.created_at)}\t{revoked}"
            )


@tokens_app.command("revoke")
def tokens_revoke(token_id: Annotated[str, typer.Argument(help="The token's id (tok_…).")]) -> None:
    """Revoke a token by id; it stops working within a few seconds."""
    settings = load_settings()
    migrate_or_fail(settings)
    try:
        with write_transaction(_open(settings)) as session:
            info = revoke_token(session, token_id, datetime.now(UTC))
    except BillingError as error:
        fail(str(error))
    typer.echo(f"billing: token {info.id} revoked", err=True)


prices_app = typer.Typer(help="Model prices.", no_args_is_help=True)
app.add_typer(prices_app, name="prices")


def _open(settings: Settings) -> sessionmaker[Session]:
    return make_sessionmaker(make_engine(settings))


@prices_app.command("load")
def prices_load(
    file: Annotated[Path, typer.Argument(help="A JSON list of prices (as POST /v1/prices).")],
) -> None:
    """Load prices from FILE; an identical stored price is skipped, a different one fails."""
    settings = load_settings()
    try:
        document = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        fail(f"cannot read {file}: {error}")
    if not isinstance(document, list):
        fail(f"{file} must hold a JSON list of price objects")
    try:
        prices = [PriceIn.model_validate(item) for item in document]
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        fail(f"{file}: price {where}: {first['msg']}")
    migrate_or_fail(settings)
    created = 0
    try:
        with write_transaction(_open(settings)) as session:
            now = datetime.now(UTC)
            for price in prices:
                created += record_price(session, price, now)[1]
    except BillingError as error:
        fail(str(error))
    present = len(prices) - created
    typer.echo(f"billing: {created} price(s) added, {present} already present", err=True)


@app.command()
def reconcile() -> None:
    """Run one reconciliation pass now and print what it settled and adjusted (JSON)."""
    settings = load_settings()
    configure_logging(settings.log_level)
    migrate_or_fail(settings)
    try:
        result = run_pass(_open(settings), settings)
    except SQLAlchemyError as error:
        fail(f"reconciliation failed: {str(getattr(error, 'orig', error)).strip().splitlines()[0]}")
    typer.echo(
        json.dumps(
            {"examined": result.examined, "settled": result.settled, "adjusted": result.adjusted}
        )
    )


_EXPORT_FLAGS = {
    "query.since": "--since",
    "query.until": "--until",
    "query.group_by": "--group-by",
    "query.tz": "--tz",
}


def _write_export(chunks: Iterator[bytes], output: Path | None) -> tuple[int, str]:
    """Write the CSV chunks to ``output`` (atomically) or to standard output; (bytes, sha256)."""
    digest = hashlib.sha256()
    size = 0
    if output is None:
        stream = typer.get_binary_stream("stdout")
        for chunk in chunks:
            stream.write(chunk)
            digest.update(chunk)
            size += len(chunk)
        stream.flush()
        return size, digest.hexdigest()
    partial = output.with_name(output.name + ".partial")
    try:
        with partial.open("wb") as file:
            for chunk in chunks:
                file.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        os.replace(partial, output)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return size, digest.hexdigest()


@app.command("export")
def export(
    kind: Annotated[
        str, typer.Argument(help="usage (rows per group) or calls (one row per ledger entry).")
    ] = "usage",
    since: Annotated[
        str | None, typer.Option(help="Period start (inclusive), RFC 3339 with offset.")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Period end (exclusive), RFC 3339 with offset.")
    ] = None,
    group_by: Annotated[
        str | None,
        typer.Option(
            help="usage: comma list of api_key_id, model, hour, day, month "
            "(default day,api_key_id,model)."
        ),
    ] = None,
    tz: Annotated[
        str | None, typer.Option(help="usage: IANA zone where buckets begin (default UTC).")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(help="Write the CSV to FILE and a manifest to FILE.manifest.json."),
    ] = None,
) -> None:
    """Export the ledger booked in [since, until) as CSV: the bytes of GET /v1/exports/KIND.csv.

    The CSV goes to standard output, or with --output to FILE plus a manifest FILE.manifest.json.

    The manifest holds the parameters, closed or provisional, rows, token and cost totals, SHA-256.
    """
    settings = load_settings()
    if kind not in KINDS:
        fail(f"unknown export {kind!r}: use usage or calls")
    if kind == "calls" and (group_by is not None or tz is not None):
        fail("--group-by and --tz apply to usage exports only")
    try:
        params = parse_params("calls" if kind == "calls" else "usage", since, until, group_by, tz)
    except ValidationFailed as error:
        fail("; ".join(f"{_EXPORT_FLAGS.get(e.path, e.path)} {e.message}" for e in error.errors))
    migrate_or_fail(settings)
    sessions = _open(settings)
    now = datetime.now(UTC)
    period = period_label(params, now, settings.close_lag_s)
    stats = ExportStats()
    try:
        if sys.stderr.isatty():
            total = count_entries(sessions, params)
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
            )
            with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
                task = bar.add_task(f"exporting {kind}", total=total)
                chunks = export_chunks(sessions, params, stats, lambda n: bar.advance(task, n))
                size, sha256 = _write_export(chunks, output)
        else:
            size, sha256 = _write_export(export_chunks(sessions, params, stats), output)
    except SQLAlchemyError as error:
        fail(f"export failed: {str(getattr(error, 'orig', error)).strip().splitlines()[0]}")
    except OSError as error:
        fail(f"cannot write {output}: {error.strerror or error}")
    if output is None:
        typer.echo(f"billing: {stats.rows} row(s), {period} period", err=True)
        return
    manifest_path = output.with_name(output.name + ".manifest.json")
    manifest = {
        "file": output.name,
        **params.as_json(),
        "period": period,
        "exported_at": now.isoformat().replace("+00:00", "Z"),
        "close_lag_s": settings.close_lag_s,
        **stats.as_json(),
        "bytes": size,
        "sha256": sha256,
    }
    try:
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    except OSError as error:
        fail(f"cannot write {manifest_path}: {error.strerror or error}")
    typer.echo(
        f"billing: {stats.rows} row(s), {period} period, written to {output} "
        f"(manifest {manifest_path.name}, sha256 {sha256})",
        err=True,
    )


@app.command()
def replay(
    file: Annotated[Path, typer.Argument(help="A recorded SSE response body (e.g. x.sse).")],
    protocol: Annotated[
        str, typer.Option(help="openai.chat_completions, openai.responses or anthropic.messages.")
    ],
    api_key_id: Annotated[str, typer.Option("--api-key-id", help="The customer's key id.")],
    model: Annotated[
        str | None, typer.Option(help="Model for stream.started (default: from the stream).")
    ] = None,
    request_id: Annotated[
        str | None, typer.Option("--request-id", help="Call id (default: replay-<uuid4 hex>).")
    ] = None,
    disconnect_after: Annotated[
        int | None,
        typer.Option(
            "--disconnect-after",
            help="The client leaves once N output tokens were delivered (by the tap's count).",
        ),
    ] = None,
    url: Annotated[str, typer.Option(help="The billing service.")] = DEFAULT_URL,
    token: Annotated[
        str | None,
        typer.Option(envvar="BILLING_TOKEN", help="Bearer token (admin to settle and read)."),
    ] = None,
) -> None:
    """Play a recorded stream to a running service as a gateway would; print the request id,
    then the call (JSON) after one reconciliation pass."""
    try:
        result = replay_stream(
            file,
            protocol=protocol,
            api_key_id=api_key_id,
            url=url,
            token=token,
            model=model,
            request_id=request_id,
            disconnect_after=disconnect_after,
        )
    except ReplayError as error:
        fail(str(error))
    typer.echo(result.request_id)
    try:
        call = fetch_call(result.request_id, url=url, token=token)
    except ReplayError as error:
        fail(str(error))
    typer.echo(json.dumps(call, indent=2))


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)
