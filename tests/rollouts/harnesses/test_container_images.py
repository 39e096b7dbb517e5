"""rollouts/harnesses/container_images.py: what `forge sandbox build-image --harness NAMES` refuses before it
reaches a Docker engine (one line naming the fix)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.errors import HarnessError
from openforge.rollouts.harnesses.container_images import build_harness_image


def test_no_names_and_a_harness_without_an_image_are_refused(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="name at least one harness"):
        build_harness_image([], tmp_path)
    with pytest.raises(HarnessError, match="'mini' needs no image of its own: it runs on the python image"):
        build_harness_image(["mini"], tmp_path)
    with pytest.raises(HarnessError, match="mini is not an npm program.*build it alone"):
        build_harness_image(["mini", "claude-code"], tmp_path)
