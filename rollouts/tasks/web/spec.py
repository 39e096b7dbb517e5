"""The `gui` part of a task (its web payload's, rollouts/tasks/web/payload.py): which site the sandbox's
browser shows and what state passes.

    {"id": "...", "instruction": "...", "family": {"kind": "web", "gui": {"site": "shop", "params": {...},
     "path": "/", "mode": "kiosk", "expect_state": {"cart": ["mug-blue"]}}}, "solution": "..."}

`expect_state` is checked exactly, key by key, against the site's state (rollouts/tasks/web/sites.py) read on
the host after the agent has stopped; with `expect_answer` too, both must hold.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class GuiTask(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    site: str = Field(description="a site of rollouts/tasks/web/sites.py (shop, wiki, booking, settings, "
                                  "editor-prefs, notes, colour)")
    params: dict[str, Any] = Field(default_factory=dict, description="the site's data for this task")
    path: str = Field("/", description="the page chromium opens first")
    mode: Literal["kiosk", "app"] = Field("kiosk", description="kiosk: a full-screen page; app: a bare window")
    expect_state: dict[str, Any] = Field(default_factory=dict, description="state key -> exact value")

    @model_validator(mode="after")
    def _known_site(self) -> "GuiTask":
        from openforge.rollouts.tasks.web.sites import SITES, make_site
        if self.site not in SITES:
            raise ValueError(f"unknown site {self.site!r} (known: {', '.join(sorted(SITES))})")
        if not self.path.startswith("/"):
            raise ValueError("path must start with /")
        try:
            initial = make_site(self.site, dict(self.params)).state()
        except KeyError as exc:  # a param the site needs
            raise ValueError(f"bad params for site {self.site}: {exc.args[0]!r} is missing") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad params for site {self.site}: {exc!r}") from None
        unknown = sorted(set(self.expect_state) - set(initial))
        if unknown:
            raise ValueError(f"expect_state names what site {self.site} has no state for: {', '.join(unknown)}")
        if self.expect_state and all(initial.get(k) == v for k, v in self.expect_state.items()):
            raise ValueError("expect_state already holds before the agent acts (an agent doing nothing would pass)")
        return self
