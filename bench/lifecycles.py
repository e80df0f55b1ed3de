"""The workload every benchmark posts: realistic stream lifecycles, interleaved across calls."""

from __future__ import annotations

import random
import secrets
from datetime import UTC, datetime
from typing import Any

import orjson

KEYS = [f"key_{i:04x}" for i in range(500)]
MODELS = [
    ("claude-sonnet-5-5", "anthropic.messages"),
    ("claude-haiku-5", "anthropic.messages"),
    ("claude-opus-5", "anthropic.messages"),
    ("gpt-5.6-sol", "openai.responses"),
    ("gpt-5.6-mini", "openai.responses"),
    ("gpt-5.6-sol", "openai.chat_completions"),
    ("gpt-5.6-nano", "openai.chat_completions"),
    ("o9-reasoner", "openai.responses"),
]
TEAMS = ["search", "support", "ads", "growth", "infra", "research"]


class Lifecycles:
    """An endless, interleaved stream of lifecycle events for ``inflight`` concurrent calls.

    Each event is returned as its JSON bytes. Request ids are random (as a gateway's are); event ids
    are ``<request_id>-<n>``, unique across the run.
    """

    def __init__(self, seed: int, inflight: int = 64) -> None:
        self.rng = random.Random(seed)
        self.inflight = inflight
        self.active: list[list[dict[str, Any]]] = []
        self.count = 0
        self._stamp = ""
        self._refresh()

    def _refresh(self) -> None:
        now = datetime.now(UTC)
        self._stamp = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"

    def _plan(self) -> list[dict[str, Any]]:
        rng = self.rng
        request_id = "req_" + secrets.token_hex(10)
        key = KEYS[int(rng.paretovariate(1.2)) % len(KEYS)]
        model, protocol = MODELS[rng.randrange(len(MODELS))]
        plan: list[dict[str, Any]] = []
        retried = rng.random() < 0.02
        for attempt in (1, 2) if retried else (1,):
            started: dict[str, Any] = {
                "event_id": "",
                "request_id": request_id,
                "type": "stream.started",
                "api_key_id": key,
                "model": model,
                "protocol": protocol,
                "input_tokens": rng.randrange(20, 20_000),
            }
            if attempt > 1:
                started["attempt"] = attempt
            if rng.random() < 0.3:
                started["metadata"] = {"team": rng.choice(TEAMS), "user": f"u{rng.randrange(9999)}"}
            plan.append(started)
            generated = delivered = 0
            for _ in range(rng.randrange(2, 9)):
                generated += rng.randrange(10, 200)
                delivered = max(delivered, generated - rng.randrange(0, 8))
                plan.append(
                    {
                        "type": "stream.tokens",
                        "output_tokens_generated": generated,
                        "output_tokens_delivered": delivered,
                    }
                )
            if attempt == 1 and retried:
                plan.append(
                    {
                        "type": "stream.failed",
                        "error_type": "overloaded_error",
                        "message": "Overloaded",
                        "output_tokens_generated": generated,
                    }
                )
                continue
            if rng.random() < 0.05:
                plan.append(
                    {
                        "type": "stream.client_disconnected",
                        "output_tokens_delivered": delivered,
                        "output_tokens_generated": generated,
                    }
                )
                generated += rng.randrange(50, 500)  # the upstream keeps generating
            upstream = rng.random() >= 0.05
            usage: dict[str, Any] = {
                "type": "stream.usage",
                "input_tokens": started["input_tokens"],
                "output_tokens": generated,
                "source": "upstream" if upstream else "estimate",
            }
            if protocol == "anthropic.messages":
                usage["cache_read_input_tokens"] = rng.choice((0, 0, 1024, 4096))
                usage["stop_reason"] = "end_turn"
            else:
                usage["reasoning_tokens"] = generated // 3 if model.startswith("o9") else 0
                usage["stop_reason"] = "stop"
            plan.append(usage)
        # Number and address every event.
        current = 1
        for n, event in enumerate(plan):
            if event["type"] == "stream.started":
                current = event.get("attempt", 1)
            event["event_id"] = f"{request_id}-{n}"
            event["request_id"] = request_id
            if current > 1:
                event["attempt"] = current
        plan.reverse()  # pop() from the end
        return plan

    def next(self) -> bytes:
        """The next event of a random in-flight call, as JSON bytes."""
        active = self.active
        while len(active) < self.inflight:
            active.append(self._plan())
        i = self.rng.randrange(len(active))
        plan = active[i]
        event = plan.pop()
        if not plan:
            active[i] = self._plan()
        self.count += 1
        if self.count % 500 == 0:
            self._refresh()
        event["occurred_at"] = self._stamp
        return orjson.dumps(event)

    def body(self, size: int) -> bytes:
        return b'{"events":[' + b",".join(self.next() for _ in range(size)) + b"]}"
