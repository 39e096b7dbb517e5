"""The apiserver's small protocol pieces the double needs: timestamps, metav1.Status errors, label
and field selectors."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aiohttp import web


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_json(code: int, reason: str, message: str, details: dict | None = None) -> dict[str, Any]:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


def _error(code: int, reason: str, message: str, details: dict | None = None) -> web.Response:
    return web.json_response(status_json(code, reason, message, details), status=code)


def parse_selector(selector: str) -> list[tuple[str, str, str | None]]:
    """Equality-based selectors: `k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated."""
    terms = []
    for part in filter(None, (p.strip() for p in selector.split(","))):
        if "!=" in part:
            k, v = part.split("!=", 1)
            terms.append(("!=", k.strip(), v.strip()))
        elif "=" in part:
            k, v = part.replace("==", "=").split("=", 1)
            terms.append(("=", k.strip(), v.strip()))
        elif part.startswith("!"):
            terms.append(("!", part[1:].strip(), None))
        else:
            terms.append(("exists", part, None))
    return terms


def selector_matches(terms: list[tuple[str, str, str | None]], values: dict[str, str]) -> bool:
    for op, key, want in terms:
        have = values.get(key)
        if (op == "=" and have != want) or (op == "!=" and have == want) or (op == "!" and have is not None) \
                or (op == "exists" and have is None):
            return False
    return True
