"""Image inputs of the three APIs -> `ImageInput` (the bytes as sent, their sha256 and format).

    Chat        {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}
    Responses   {"type": "input_image", "image_url": "data:image/png;base64,..."}
    Anthropic   {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "..."}}

Only inline bytes are taken. A remote URL (http/https, Anthropic's `source.type: url`, a file id) is
refused: a sandboxed harness must never make the proxy fetch the network, or read files, for it.
Malformed base64, a format a VLM processor cannot read, and images over the APIs' own size limit are
clear 400s in the calling API's error shape.

A GUI agent resends every earlier screenshot on every turn, so a recorded request body keeps each
image as a reference to the run's image file (`slim_body`: its base64 replaced by
`forge-image:<sha256>`), not its bytes: a rollout's rows grow with its text, not with turns x
screenshots. Reading a recorded body back (after a proxy restart, an export) resolves those
references from the run's ImageStore (`resolving_from`); a client cannot use them (they are not base64).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from openforge.image_store import MAX_IMAGE_BYTES, ImageError, image_format, image_id
from openforge.proxy.calls import APIError, bad_request

NO_FETCH = "the proxy never fetches the network (nor reads files) for a sandbox"
REFERENCE = "forge-image:"  # a recorded body's stand-in for an image's base64 (+ its sha256)
# Set only while a recorded body is re-parsed: how a reference becomes bytes again.
_resolver: ContextVar[Callable[[str], bytes] | None] = ContextVar("forge_image_resolver", default=None)


def slim_body(raw: str, images: list[ImageInput]) -> str:
    """`raw` (a request body's JSON text) with each image's base64 replaced by its reference. A
    payload written in another form (escaped slashes, other padding) is left as sent."""
    for im in {im.sha: im for im in images}.values():
        raw = raw.replace(base64.b64encode(im.data).decode("ascii"), REFERENCE + im.sha)
    return raw


@contextmanager
def resolving_from(get: Callable[[str], bytes]) -> Iterator[None]:
    """Within this block, parsed image references are read with `get(sha)` (an ImageStore's `get`)."""
    token = _resolver.set(get)
    try:
        yield
    finally:
        _resolver.reset(token)


@dataclass(frozen=True, eq=False)
class ImageInput:
    """One image of a request: its bytes exactly as the client sent them (base64-decoded)."""

    data: bytes
    format: str  # png | jpeg | gif | webp, from the bytes themselves

    @cached_property
    def sha(self) -> str:
        return image_id(self.data)

    @property
    def data_url(self) -> str:
        """SGLang's `image_data` item for this image."""
        return f"data:image/{self.format};base64,{base64.b64encode(self.data).decode('ascii')}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageInput) and other.sha == self.sha

    def __hash__(self) -> int:
        return hash(self.sha)


def from_base64(payload: Any, where: str) -> ImageInput:
    if not isinstance(payload, str) or not payload:
        raise bad_request(f"{where}: the image's base64 data is missing", where)
    get = _resolver.get()
    if get is not None and payload.startswith(REFERENCE):  # a recorded body read back
        try:
            data = get(payload[len(REFERENCE):])
        except (ImageError, OSError) as exc:
            raise bad_request(f"{where}: the recorded image is not available: {exc}", where) from None
        return ImageInput(data, image_format(data))
    # base64 of 20 MiB is ~27 MiB of text: refuse by length before decoding.
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise _too_large(where, len(payload) * 3 // 4)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where}: the image data is not valid base64", where) from None
    if len(data) > MAX_IMAGE_BYTES:
        raise _too_large(where, len(data))
    try:
        fmt = image_format(data)
    except ImageError as exc:
        raise bad_request(f"{where}: {exc}", where) from None
    return ImageInput(data, fmt)


def _too_large(where: str, size: int) -> APIError:
    return bad_request(f"{where}: the image is {size} bytes, over the limit of {MAX_IMAGE_BYTES} bytes", where)


def from_url(url: Any, where: str) -> ImageInput:
    """An OpenAI `image_url` (Chat) or `input_image.image_url` (Responses): a base64 data URL only."""
    if not isinstance(url, str) or not url:
        raise bad_request(f"{where}: the image URL is missing", where)
    head = url[:16].lower()
    if head.startswith(("http://", "https://")):
        raise bad_request(f"{where}: remote image URLs are refused: {NO_FETCH}; send the image inline as a "
                          "data URL (data:image/png;base64,...)", where)
    if not head.startswith("data:"):
        raise bad_request(f"{where}: the image URL must be a data URL (data:image/<format>;base64,...): {NO_FETCH}",
                          where)
    meta, sep, payload = url.partition(",")
    if not sep or not meta.lower().startswith("data:image/") or not meta.lower().endswith(";base64"):
        raise bad_request(f"{where}: the image URL must be a base64 image data URL (data:image/<format>;base64,...)",
                          where)
    return from_base64(payload, where)


def openai_part(part: dict[str, Any], where: str) -> ImageInput:
    """Chat's `image_url` part or Responses' `input_image` part."""
    if part.get("type") == "image_url":
        value = part.get("image_url")
        url = value.get("url") if isinstance(value, dict) else value
    else:
        if part.get("file_id") and not part.get("image_url"):
            raise bad_request(f"{where}: file ids are refused ({NO_FETCH} and keeps no files); send the image "
                              "inline as a data URL", where)
        url = part.get("image_url")
    return from_url(url, where)


def anthropic_block(block: dict[str, Any], where: str) -> ImageInput:
    """An Anthropic `image` block: `source.type` must be base64."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind in ("url", "file"):
        raise bad_request(f"{where}: image sources of type {kind!r} are refused: {NO_FETCH}; send the image as "
                          "{'type': 'base64', 'media_type': ..., 'data': ...}", where)
    if kind != "base64":
        raise bad_request(f"{where}.source must be {{'type': 'base64', 'media_type': 'image/png', 'data': ...}}",
                          where)
    return from_base64(source.get("data"), where)
