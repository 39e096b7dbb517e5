"""Read a W&B offline run file (`run-<id>.wandb`) back, record by record, as wandb's own protobufs.

wandb 0.31 writes these files from its Go core and no longer ships the Python reader
(`wandb.sdk.internal.datastore`, removed with the Python core); this is that reader's format, a
LevelDB log (github.com/google/leveldb doc/log_format.md) under a 7-byte ":W&B" header, each record
checked against its CRC-32 and parsed as `wandb.proto.wandb_internal_pb2.Record`:

    header := ident ":W&B" (4 bytes), magic 0xBEE1 (uint16 LE), version 0 (uint8)
    record := crc32 (uint32 LE, seeded with the type byte), length (uint16 LE), type (uint8), data
    type   := FULL 1 | FIRST 2 | MIDDLE 3 | LAST 4, within 32 KiB blocks padded with zeros
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), f"{path} is not a W&B run file"
    seeds = {t: zlib.crc32(bytes([t])) for t in (FULL, FIRST, MIDDLE, LAST)}
    i, pending = HEADER, b""
    while i + HEADER <= len(data):
        if BLOCK - i % BLOCK < HEADER:  # the block's tail is padding
            i += BLOCK - i % BLOCK
            continue
        checksum, length, kind = struct.unpack("<IHB", data[i:i + HEADER])
        chunk = data[i + HEADER:i + HEADER + length]
        i += HEADER + length
        if kind == 0 and length == 0:  # zero padding at the end of a block being written
            continue
        assert zlib.crc32(chunk, seeds[kind]) & 0xFFFFFFFF == checksum, f"{path}: bad checksum at {i}"
        pending += chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def finished(path: Path, timeout_s: float = 60.0) -> Path:
    """`path` once W&B's core has written the run's exit record: `run.finish()` returns before its
    writer has flushed the file (it flushes on the service's teardown, at the latest at process exit)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not any(r.WhichOneof("record_type") == "exit" for r in records(path)):
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout_s:.0f}s"
        time.sleep(0.2)
    return path


def history(path: Path) -> list[dict[str, Any]]:
    """Each `run.log` row: {key: value}, nested keys joined with '/' as W&B shows them."""
    rows = []
    for r in records(path):
        if r.WhichOneof("record_type") == "history":
            rows.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in r.history.item})
    return rows


def run_record(path: Path) -> Any:
    kinds = [(r.WhichOneof("record_type"), r) for r in records(path)]
    runs = [r.run for kind, r in kinds if kind == "run"]
    assert runs, f"{path} holds no run record, only {[kind for kind, _ in kinds]}"
    return runs[0]


def config(path: Path) -> dict[str, Any]:
    """The run's config as `wandb.init(config=...)` gave it (the run record, plus later config records)."""
    out: dict[str, Any] = {}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        items = r.run.config.update if kind == "run" else r.config.update if kind == "config" else []
        for item in items:
            out["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
    return out
