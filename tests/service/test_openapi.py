"""The OpenAPI schema, as a client fetches it: every route summarised, every field described, every error
status of the API documented with the one error shape."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from tests.service.conftest import Running

GUARDED_ERRORS = {"400", "401", "404", "413", "422", "503", "504"}  # routes that take a request for a model


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, item in schema["paths"].items() for method, op in item.items()]


def undescribed_fields(schema: dict[str, Any]) -> list[str]:
    """``Model.field`` for every property of every component schema that has no description."""
    missing = []
    for name, component in schema["components"]["schemas"].items():
        if name in ("HTTPValidationError", "ValidationError"):  # FastAPI's own, not ours (422 uses ErrorBody)
            continue
        for field, spec in component.get("properties", {}).items():
            if not spec.get("description"):
                missing.append(f"{name}.{field}")
    return missing


def test_every_route_has_a_summary(tiny_server: Running) -> None:
    schema = httpx.get(f"{tiny_server.url}/openapi.json").json()
    ops = operations(schema)
    paths = {path for path, _, _ in ops}
    assert {"/predict", "/predict/image", "/feedback", "/models", "/models/{name}", "/health/live", "/health/ready",
            "/metrics", "/v2", "/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"} <= paths
    assert [f"{method} {path}" for path, method, op in ops if not op.get("summary")] == []


def test_every_field_is_described(tiny_server: Running) -> None:
    schema = httpx.get(f"{tiny_server.url}/openapi.json").json()
    assert undescribed_fields(schema) == []


def test_prediction_routes_document_every_error_with_the_error_shape(tiny_server: Running) -> None:
    schema = httpx.get(f"{tiny_server.url}/openapi.json").json()
    for path in ("/predict", "/predict/image", "/v2/models/{name}/infer"):
        responses = schema["paths"][path]["post"]["responses"]
        assert set(responses) >= GUARDED_ERRORS, (path, sorted(responses))
        for code in GUARDED_ERRORS:
            content = responses[code]["content"]["application/json"]["schema"]
            assert content == {"$ref": "#/components/schemas/ErrorBody"}, (path, code, content)
            assert responses[code]["description"]


def test_api_docs_list_every_route_with_its_triton_counterpart(tiny_server: Running) -> None:
    """docs/api.md's "Triton and KServe" table names every route of the schema, and no other."""
    schema = httpx.get(f"{tiny_server.url}/openapi.json", timeout=30).json()
    served = {f"{method.upper()} {path}" for path, method, _ in operations(schema)}
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    section = text.split("## Triton and KServe", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `((?:GET|POST) [^`]+)` \|", section, flags=re.MULTILINE))
    assert listed == served
