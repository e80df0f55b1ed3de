"""Issue 44: a secret sent where a public id belongs is refused in every place that takes an
id (an event's ``api_key_id`` and ``upstream_account``, a key's path id, its ``customer_id`` and
``plan_id``, a plan's id), read through Unicode look-alikes (NFKC, the hyphen look-alikes as
``-``), JSON Web Tokens, the newer providers' prefixes, and a secret after a prefix or a
space; ordinary ids that share a few letters with a prefix stay accepted."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from billing.secret_ids import looks_like_secret
from tests.auth.test_auth import EVENT

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.c2lnbmF0dXJl"
SECRETS = [
    "sk\u2011proj-abc123",  # non-breaking hyphen
    "sk\u2010proj-abc123",
    "sk\u2012ant-api03-x",
    "sk\u2013ant-api03-x",
    "sk\u2014ant-api03-x",
    "sk\u2212ant-api03-x",  # minus sign
    "\uff53\uff4b\uff0dproj-1",  # full width
    "sk-ant-api03-" + "A" * 20,
    JWT,
    "hf_" + "aBcD" * 8,
    "glpat-" + "x1Y2" * 5,
    "pplx-" + "f00d" * 12,
    "r8_" + "Zz09" * 9,
    "prod:sk-proj-" + "a" * 20,
    "team key sk-" + "b" * 40,
    "gateway/" + JWT,
    "bearer:" + JWT,
]
ORDINARY = ["key_7f3a", "hf_model", "task-runner-1234567890abcdef", "desk-sk-1", "r8_team"]


@pytest.mark.nodb
@pytest.mark.parametrize("value", SECRETS)
def test_a_secret_is_recognised(value: str) -> None:
    assert looks_like_secret(value)


@pytest.mark.nodb
@pytest.mark.parametrize("value", ORDINARY)
def test_an_ordinary_id_is_not_a_secret(value: str) -> None:
    assert not looks_like_secret(value)


@pytest.mark.parametrize("secret", SECRETS)
def test_every_place_that_takes_an_id_refuses_a_secret(client: TestClient, secret: str) -> None:
    for field in ("api_key_id", "upstream_account"):
        response = client.post("/v1/events", json={"events": [{**EVENT, field: secret}]})
        assert response.status_code == 422, (field, response.text)
        [error] = response.json()["errors"]
        assert error["path"] == f"events[0].{field}" and "public id" in error["message"]
    path = client.put(f"/v1/keys/{quote(secret, safe='')}", json={"name": "k"})
    assert path.status_code == 422, path.text
    assert [e["path"] for e in path.json()["errors"]] == ["path.api_key_id"]
    for field in ("customer_id", "plan_id"):
        body = client.put("/v1/keys/key_ok", json={field: secret})
        assert body.status_code == 422, (field, body.text)
        assert any(e["path"] == f"body.{field}" for e in body.json()["errors"])
    plan = client.post("/v1/plans", json={"plan_id": secret, "markup_pct": "10"})
    assert plan.status_code == 422 and "body.plan_id" in plan.text
    assert client.get("/v1/calls").json()["data"] == []
    assert client.get("/v1/keys").json()["data"] == []


@pytest.mark.parametrize("key", ORDINARY)
def test_an_ordinary_id_is_accepted(client: TestClient, key: str) -> None:
    event = {**EVENT, "api_key_id": key}
    assert client.post("/v1/events", json={"events": [event]}).status_code == 200
