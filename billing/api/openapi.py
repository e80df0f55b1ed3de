"""OpenAPI declarations for what a route reads itself: its query string and its raw body.

The query endpoints parse their query strings with ``billing.calllog.params`` (its 422 messages
are the contract's), and ``POST /v1/events`` reads its body as bytes: FastAPI must not parse
either. A pydantic model still declares each of them, and these helpers turn the model into the
operation's ``parameters`` or ``requestBody`` (``openapi_extra``); ``hoist_definitions`` moves the
body models' definitions into ``components/schemas`` when the app builds its schema.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

_REF = "#/components/schemas/{model}"


def query_parameters(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` declaring each field of ``model`` as a query parameter: its schema,
    description, and whether it is required (a field without a default)."""
    schema = model.model_json_schema(ref_template=_REF)
    if "$defs" in schema:
        raise TypeError(f"{model.__name__}: a query parameter is a plain value, not a model")
    required = set(schema.get("required", ()))
    parameters = []
    for name, field in schema["properties"].items():
        field = dict(field)
        description = field.pop("description", None)
        field.pop("title", None)
        field.pop("default", None)
        # Absent is how a query string says null: the parameter's schema is its value's.
        values = [s for s in field.pop("anyOf", ()) if s != {"type": "null"}]
        if len(values) == 1:
            field.update(values[0])
        elif values:
            field["anyOf"] = values
        parameter = {"name": name, "in": "query", "required": name in required, "schema": field}
        if description:
            parameter["description"] = description
        parameters.append(parameter)
    return {"parameters": parameters}


def request_body(model: type[BaseModel], description: str) -> dict[str, Any]:
    """``openapi_extra`` declaring ``model`` as the JSON request body of a route that reads its
    body itself. Its definitions stay under ``$defs`` until ``hoist_definitions`` runs."""
    schema = model.model_json_schema(ref_template=_REF)
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {"application/json": {"schema": schema}},
        }
    }


def hoist_definitions(document: dict[str, Any]) -> None:
    """Move each ``request_body`` schema into ``components/schemas`` (with its ``$defs``) and
    refer to it there. Raises ``ValueError`` when a name is taken by a different schema."""
    components = document.setdefault("components", {}).setdefault("schemas", {})
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            content = operation.get("requestBody", {}).get("content", {})
            for media in content.values():
                schema = media.get("schema", {})
                if "$defs" not in schema:
                    continue
                definitions = {**schema.pop("$defs"), schema["title"]: schema}
                for name, definition in definitions.items():
                    if components.setdefault(name, definition) != definition:
                        raise ValueError(f"two different schemas are named {name!r}")
                media["schema"] = {"$ref": _REF.format(model=schema["title"])}
