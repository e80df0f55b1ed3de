"""``billing replay``: play a recorded stream to a running service as a gateway would."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

from billing.cli.common import fail
from billing.replay import DEFAULT_URL, ReplayError, fetch_call
from billing.replay import replay as replay_stream


def replay(
    file: Annotated[
        Path,
        typer.Argument(
            help="A recorded SSE response body (x.sse), or a non-streaming response body (x.json)."
        ),
    ],
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
    input_tokens: Annotated[
        int | None,
        typer.Option(
            "--input-tokens",
            help="The gateway's own input token count (sent as stream.started.input_tokens).",
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
    # The command reports every delivery problem itself, in one line (billing.replay collects
    # them through the client's on_error), so the client's own WARNING lines are not printed.
    logging.getLogger("billing.client").addHandler(logging.NullHandler())
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
            input_tokens=input_tokens,
        )
    except ReplayError as error:
        fail(str(error))
    typer.echo(result.request_id)
    try:
        call = fetch_call(result.request_id, url=url, token=token)
    except ReplayError as error:
        fail(str(error))
    typer.echo(json.dumps(call, indent=2))
