"""Images a call carried, stored once each under the run's folder, named by their content.

`runs/<run id>/images/<sha256>.<ext>` holds the bytes exactly as the client sent them (decoded from
base64, never re-encoded): the engine, the trainer and an export all read the same bytes, so the
pixels a model was trained on are the pixels it saw. A call row lists the sha256 ids of its images in
the order their placeholders appear in its prompt ids (`call.images`), and so does a trajectory
segment (`trajectory.images`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from openforge.errors import ForgeError
from openforge.paths import runs_dir

# Magic bytes of the formats a VLM processor reads (PIL). Anything else is refused before decoding.
_FORMATS = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
)
MAX_IMAGE_BYTES = 20 * 1024 * 1024  # the Anthropic and OpenAI APIs' own per-image limit


class ImageError(ForgeError):
    """An image input is not one this proxy can take (format, size, a remote URL)."""


def image_format(data: bytes) -> str:
    """`png`, `jpeg`, `gif` or `webp` from the leading bytes; ImageError for anything else."""
    for magic, name in _FORMATS:
        if data.startswith(magic):
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    raise ImageError("image is not PNG, JPEG, GIF or WebP")


def image_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ImageInfo:
    """What `forge calls --show` and the dashboard list of a stored image."""

    sha: str
    path: Path | None  # None: not in the run's folder (deleted, or the run dir is elsewhere)
    format: str = "?"
    size: int = 0  # bytes
    width: int | None = None
    height: int | None = None

    @property
    def dimensions(self) -> str:
        return f"{self.width}x{self.height}" if self.width is not None else "?"


class ImageStore:
    """Content-addressed image files of one run. Writes are atomic (temp file + rename), so two
    proxy workers storing the same image race harmlessly."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def for_run(cls, home: Path, run_id: str) -> ImageStore:
        return cls(runs_dir(home) / run_id / "images")

    def put(self, data: bytes) -> str:
        """Store `data` (once) and return its id, the sha256 hex of the bytes."""
        if len(data) > MAX_IMAGE_BYTES:
            raise ImageError(f"image is {len(data)} bytes, over the limit of {MAX_IMAGE_BYTES}")
        ext = image_format(data)
        sha = image_id(data)
        path = self.root / f"{sha}.{ext}"
        if not path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return sha

    def path(self, sha: str) -> Path:
        found = sorted(self.root.glob(f"{sha}.*")) if len(sha) == 64 and sha.isalnum() else []
        found = [p for p in found if not p.name.endswith(".tmp")]
        if not found:
            raise ImageError(f"image {sha[:12]} is not in {self.root}")
        return found[0]

    def get(self, sha: str) -> bytes:
        data = self.path(sha).read_bytes()
        if image_id(data) != sha:
            raise ImageError(f"image {sha[:12]} in {self.root} does not match its name (changed on disk)")
        return data

    def describe(self, sha: str) -> ImageInfo:
        """The image's file, format, size and pixel dimensions (read from its header only)."""
        try:
            path = self.path(sha)
        except ImageError:
            return ImageInfo(sha, None)
        width = height = None
        try:
            from PIL import Image

            with Image.open(path) as img:
                width, height = img.size
        except (ImportError, OSError, ValueError, SyntaxError):
            pass
        fmt = path.suffix.lstrip(".")
        return ImageInfo(sha, path, fmt, path.stat().st_size, width, height)
