"""Fuzzing the API with schemathesis from its own OpenAPI schema: no 5xx, responses match it.

Runs against the test's real database (SQLite or PostgreSQL); a bounded number of examples per
operation keeps it inside CI's time.
"""

from __future__ import annotations

import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

EXAMPLES_PER_OPERATION = 30


def test_no_server_error_and_responses_match_the_schema(app: FastAPI) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/events", "/v1/calls", "/v1/usage"}
    for operation in operations:
        _fuzz(operation)


def _fuzz(operation: object) -> None:
    @given(case=operation.as_strategy())  # type: ignore[attr-defined]
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])

    check()
