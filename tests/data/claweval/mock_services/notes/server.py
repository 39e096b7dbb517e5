"""Mock Notes API (FastAPI on $PORT), in the shape of ClawEval's mock services."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from fastapi import FastAPI
from pydantic import BaseModel

from mock_services._base import add_error_injection

app = FastAPI(title="Mock Notes API")
add_error_injection(app)

FIXTURES_PATH = Path(os.environ.get("NOTES_FIXTURES", "notes.json"))
_notes: list[dict[str, Any]] = []
_audit_log: list[dict[str, Any]] = []


def _load_fixtures() -> None:
    global _notes
    with open(FIXTURES_PATH) as f:
        _notes = json.load(f)


_load_fixtures()


class CreateRequest(BaseModel):
    title: str
    body: str = ""


class DeleteRequest(BaseModel):
    note_id: str


@app.post("/notes/list")
def list_notes() -> dict[str, Any]:
    _audit_log.append({"endpoint": "/notes/list"})
    return {"notes": _notes}


@app.post("/notes/create")
def create_note(req: CreateRequest) -> dict[str, Any]:
    note = {"note_id": f"N-{len(_notes) + 1}", "title": req.title, "body": req.body}
    _notes.append(note)
    _audit_log.append({"endpoint": "/notes/create", "request_body": req.model_dump()})
    return note


@app.post("/notes/delete")
def delete_note(req: DeleteRequest) -> dict[str, Any]:
    _audit_log.append({"endpoint": "/notes/delete", "request_body": req.model_dump()})
    return {"deleted": req.note_id}


@app.get("/notes/audit")
def audit() -> dict[str, Any]:
    return {"calls": _audit_log}


@app.post("/notes/reset")
def reset() -> dict[str, str]:
    global _audit_log
    _audit_log = []
    _load_fixtures()
    return {"status": "reset"}


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "9120")))
