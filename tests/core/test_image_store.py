"""openforge/image_store.py: a call's images stored once each under the run's folder, named by the sha256 of
their bytes, exactly as sent; anything that is not a picture refused before it is kept."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from openforge.image_store import MAX_IMAGE_BYTES, ImageError, ImageStore, image_format, image_id


def _png(colour: str, size: tuple[int, int] = (7, 5)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def test_an_image_is_stored_once_under_its_content_and_read_back_as_sent(forge_home: Path) -> None:
    store = ImageStore.for_run(forge_home, "run-1")
    data = _png("red")
    sha = store.put(data)
    assert sha == image_id(data) and store.put(data) == sha
    assert store.path(sha) == forge_home / "runs" / "run-1" / "images" / f"{sha}.png"
    assert list(store.root.iterdir()) == [store.path(sha)]  # once, and no temp file left
    assert store.get(sha) == data
    info = store.describe(sha)
    assert (info.format, info.size, info.dimensions) == ("png", len(data), "7x5")


def test_a_changed_file_a_missing_image_and_a_bad_id_are_errors(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    sha = store.put(_png("blue"))
    store.path(sha).write_bytes(_png("green"))
    with pytest.raises(ImageError, match="does not match its name"):
        store.get(sha)
    missing = image_id(b"never stored")
    with pytest.raises(ImageError, match="is not in"):
        store.get(missing)
    assert store.describe(missing).path is None and store.describe(missing).dimensions == "?"
    with pytest.raises(ImageError):
        store.path("../" + sha[3:])  # not an id: never a path outside the folder


def test_only_the_formats_a_processor_reads_are_taken(tmp_path: Path) -> None:
    assert image_format(b"\xff\xd8\xff\xe0rest") == "jpeg"
    assert image_format(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "webp"
    assert image_format(b"GIF89a...") == "gif"
    store = ImageStore(tmp_path / "images")
    with pytest.raises(ImageError, match="not PNG, JPEG, GIF or WebP"):
        store.put(b"<svg xmlns='http://www.w3.org/2000/svg'/>")
    with pytest.raises(ImageError, match="over the limit"):
        store.put(b"\x89PNG\r\n\x1a\n" + bytes(MAX_IMAGE_BYTES))
    assert not store.root.exists()  # nothing refused was kept
