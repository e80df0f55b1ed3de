"""The LiteLLM callback's settings and its reading of LiteLLM's objects (no proxy: the real
``litellm`` types, offline)."""

from __future__ import annotations

import os

import pytest

from tests.extras import import_or_skip

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price map fetch at import
litellm = import_or_skip("litellm", "needs the billing[litellm] extra")

from litellm.types.utils import Delta, ModelResponseStream, StreamingChoices  # noqa: E402

from billing.gateway import DrainPolicy  # noqa: E402
from billing.integrations.litellm import (  # noqa: E402
    _chunk_tokens,
    _error_type,
    _protocol,
    policy_from_env,
)

pytestmark = pytest.mark.nodb


def test_the_drain_policy_from_the_environment() -> None:
    assert policy_from_env({}) == DrainPolicy()
    assert policy_from_env({"BILLING_DRAIN": "off"}).metadata() == {"billing.drain": "off"}
    custom = policy_from_env(
        {
            "BILLING_DRAIN_MAX_S": "2.5",
            "BILLING_DRAIN_MAX_TOKENS": "100",
            "BILLING_DRAIN_MAX_CONCURRENT": "3",
        }
    )
    assert (custom.max_seconds, custom.max_tokens, custom.max_concurrent) == (2.5, 100, 3)
    with pytest.raises(ValueError, match="BILLING_DRAIN must be 'on' or 'off'"):
        policy_from_env({"BILLING_DRAIN": "maybe"})
    with pytest.raises(ValueError, match="BILLING_DRAIN_MAX_TOKENS must be a int, not 'many'"):
        policy_from_env({"BILLING_DRAIN_MAX_TOKENS": "many"})
    with pytest.raises(ValueError, match="drain bounds must be positive"):
        policy_from_env({"BILLING_DRAIN_MAX_S": "0"})


def test_routes_name_the_protocol() -> None:
    assert _protocol("/v1/chat/completions") == "openai.chat_completions"
    assert _protocol("/openai/deployments/gpt-4o/chat/completions") == "openai.chat_completions"
    assert _protocol("/v1/responses") == "openai.responses"
    assert _protocol("/v1/messages") == "anthropic.messages"


def test_a_chunks_output_tokens_by_the_bundled_tokenizer() -> None:
    def chunk(content: str | None) -> ModelResponseStream:
        return ModelResponseStream(choices=[StreamingChoices(delta=Delta(content=content))])

    assert _chunk_tokens(chunk(" t")) == 1
    assert _chunk_tokens(chunk(" hello world")) == 2  # cl100k_base: " hello", " world"
    assert _chunk_tokens(chunk("")) == 0
    assert _chunk_tokens(chunk(None)) == 0
    assert _chunk_tokens(ModelResponseStream(choices=[])) == 0  # the usage chunk


def test_litellm_exceptions_name_the_error_type() -> None:
    args = {"message": "x", "llm_provider": "openai", "model": "m"}
    assert _error_type(litellm.RateLimitError(**args)) == "overloaded_error"
    assert _error_type(litellm.ServiceUnavailableError(**args)) == "overloaded_error"
    assert _error_type(litellm.Timeout(**args)) == "stalled"
    assert _error_type(litellm.APIConnectionError(**args)) == "upstream_disconnect"
    assert _error_type(litellm.BadRequestError(**args)) == "api_error"
    # an upstream LiteLLM could not reach: a 500 caused by a connection error
    unreachable = litellm.InternalServerError(**args)
    unreachable.__cause__ = ConnectionRefusedError(111, "Connect call failed")
    assert _error_type(unreachable) == "upstream_disconnect"
    assert _error_type(litellm.InternalServerError(**args)) == "api_error"
