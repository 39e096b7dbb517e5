"""A web task's own part of its record (TaskSpec.family, kind "web"): a site served on the host, or a live page."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from openforge.rollouts.tasks.web.benchmarks import OnlineWeb
from openforge.rollouts.tasks.web.spec import GuiTask
from openforge.rollouts.tasks.payload import FamilyPayload


class WebPayload(FamilyPayload):
    """A GUI task on one of forge's sites (`gui`), or an online-only one at a live page (`online`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["web"] = "web"
    gui: GuiTask | None = Field(None, description=(
        "the site its sandbox's browser shows (served on the host) and the site state that passes "
        "(rollouts/tasks/web/spec.py)"))
    online: OnlineWeb | None = Field(None, description=(
        "an online-only task (imported WebVoyager / Online-Mind2Web): the live page it starts at; a run refuses it "
        "unless sandbox.allow_internet, with which its rollout's browser opens that page "
        "(rollouts/tasks/web/benchmarks.py)"))

    @model_validator(mode="after")
    def _one_page(self) -> WebPayload:
        if self.online is not None and self.gui is not None:
            raise ValueError("online: an online-only task opens its live page; a gui site is a local copy, not both")
        if self.online is None and self.gui is None:
            raise ValueError("a web task has a site (gui) or a live page (online)")
        return self

    @property
    def exact_graded(self) -> bool:
        return bool(self.gui and self.gui.expect_state)
