"""Error injection as ClawEval's mock_services/_base.py does it: ERROR_RATE of the POST calls answered
429 or 500 (forge sets ERROR_RATE=0 and injects at its own recording front instead)."""

import os
import random

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.middleware.base import BaseHTTPMiddleware

_EXEMPT_SUFFIXES = ("/audit", "/reset", "/health", "/docs", "/openapi.json")


class ErrorInjectionMiddleware(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next):
        path = request.url.path
        if (request.method != "POST" or path.endswith(_EXEMPT_SUFFIXES)
                or request.headers.get("X-Health-Check") == "1"):
            return await call_next(request)
        if random.random() < float(os.environ.get("ERROR_RATE", "0")):
            return JSONResponse(status_code=500, content={"error": "internal_server_error"})
        return await call_next(request)


def add_error_injection(app):
    app.add_middleware(ErrorInjectionMiddleware)
