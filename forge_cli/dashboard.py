"""The live dashboard: one run, read from the store on a timer.

    app = make_dashboard(store_path, run_id, controller=controller)   # `forge up`: can pause / stop
    app = make_dashboard(store_path, run_id)                           # `forge dash RUN`: read-only
    app.run()

Everything on screen comes from one source, the run store (plus the run's log file), so the view of
a run that another process drives, or one that ended yesterday, is the same view. The only thing the
app does besides reading is to pass `p` and `q` to the controller of the run it is driving.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, RichLog, Static
from textual_plotext import PlotextPlot

from openforge.forge_cli.snapshot import conversation
from openforge.forge_cli.staleness import async_panel
from openforge.errors import ForgeError
from openforge.image_store import ImageInfo, ImageStore
from openforge.paths import forge_home
from openforge.readmodel import Snapshot, read_snapshot, run_log_path
from openforge.store import RUN_FINAL, Call, Rollout, Store
from openforge.rollouts.analysis.analyze import behaviour_over_steps

POLL_S = 1.0


class Controller(Protocol):
    """What the dashboard may ask of the process driving the run (`openforge.runs.control.RunController`)."""

    @property
    def paused(self) -> bool: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self) -> None:
        """Ask every component to shut down (children, sandboxes); returns at once."""


def _aware(ts: datetime | None) -> datetime | None:
    # SQLite hands datetimes back naive; the store writes them in UTC.
    return ts.replace(tzinfo=UTC) if ts is not None and ts.tzinfo is None else ts


def _duration(start: datetime | None, end: datetime | None, now: datetime) -> str:
    start, end = _aware(start), _aware(end)
    if start is None:
        return "-"
    secs = int(((end or now) - start).total_seconds())
    return f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}" if secs >= 3600 else f"{secs // 60}:{secs % 60:02d}"


def _fmt(value: float | None, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


STATUS_STYLE = {
    "pending": "dim", "running": "bold yellow", "scored": "green", "failed": "red", "timed_out": "red",
    "cancelled": "dim", "interrupted": "magenta", "in_flight": "bold yellow", "ok": "green", "error": "red",
    "finished": "bold green", "paused": "bold cyan", "created": "dim", "stopped": "magenta",
}


API_SHORT = {"openai_chat": "chat", "openai_responses": "responses", "anthropic_messages": "messages"}


def _status(text: str) -> Text:
    return Text(text, style=STATUS_STYLE.get(text, ""))


def _harnesses(cfg: dict[str, Any], steps: list[Any]) -> str:
    """The run's harness; with several (harness.names), each with its reward at the newest step."""
    names = list(cfg.get("names") or [])
    if not names:
        return str(cfg.get("name", "-"))
    per = next(((s.metrics_json or {}).get("reward_by_harness") for s in reversed(steps)
                if (s.metrics_json or {}).get("reward_by_harness")), None) or {}
    return " · ".join(f"{h} {v:.2f}" for h, v in sorted(per.items())) or ", ".join(names)


def header_text(snap: Snapshot, *, paused: bool | None = None) -> Text:
    run, cfg = snap.run, snap.config
    status = "paused" if paused else run.status
    total = cfg.get("trainer", {}).get("steps")
    step = f"{len(snap.steps)}/{total}" if run.kind == "train" and total is not None else str(len(snap.steps))
    model = cfg.get("engine", {}).get("model") or "tiny"
    line1 = Text.assemble((run.id, "bold"), "  ", (run.name or "", "italic"), "  ", _status(status))
    if run.status in RUN_FINAL:
        line1.append("   (done: q to exit)", style="dim")
    fields = [
        ("model", Path(model).name or model), ("harness", _harnesses(cfg.get("harness", {}), snap.steps)),
        ("engine", cfg.get("engine", {}).get("kind", "-")), ("sandbox", cfg.get("sandbox", {}).get("type", "-")),
        ("steps", step), ("elapsed", _duration(run.started_at or run.created_at, run.ended_at, snap.now)),
        ("adapter", (run.current_adapter or "base").removeprefix(f"{run.id}-")),
    ]
    line2 = Text()
    for name, value in fields:
        line2.append(f"{name} ", style="dim")
        line2.append(f"{value}   ")
    if run.error:
        line2.append(f"\nerror: {run.error}", style="bold red")
    return line1 + Text("\n") + line2


def metrics_table(snap: Snapshot) -> Table:
    last = snap.steps[-1] if snap.steps else None
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim")
    table.add_column(justify="right")
    table.add_column(style="dim")
    table.add_column(justify="right")
    counts = " ".join(f"{k} {v}" for k, v in sorted(snap.counts.items())) or "none yet"
    get = (lambda name: getattr(last, name)) if last else (lambda name: None)
    extra = (last.metrics_json or {}) if last else {}  # step metrics without a column of their own
    times = [] if last is None else [t for t in (last.t_rollout_s, last.t_train_s, last.t_sync_s) if t is not None]
    rows = [
        ("loss", _fmt(get("loss")), "reward", _fmt(get("reward_mean"), ".3f")),
        ("KL", _fmt(get("kl")), "pass rate", _fmt(get("pass_rate"), ".2f")),
        ("mismatch", _fmt(get("mismatch_mean")), "mismatch max", _fmt(get("mismatch_max"))),
        ("mismatch KL", _fmt(extra.get("mismatch_kl")), "max ratio", _ratio(extra)),
        ("clip frac", _fmt(get("clip_frac"), ".3f"), "grad norm", _fmt(get("grad_norm"))),
        ("tokens/s", _fmt(get("tokens_per_s"), ".1f"), "step time", _fmt(sum(times) if times else None, ".1f")),
    ]
    for row in rows:
        table.add_row(*row)
    table.add_row("rollouts", Text(counts, justify="right"), "calls", str(snap.n_calls))
    if snap.judgements[0]:  # a run of tasks with a judge: its failures are infra failures, masked
        table.add_row("judgements", f"{snap.judgements[0]} ({snap.judgements[1]} failed)", "", "")
    return table


def _ratio(metrics: dict) -> str:
    """The step's largest engine/trainer ratio, with the tokens MIS / IcePop masked when there were some."""
    masked = metrics.get("masked_tokens") or 0
    return _fmt(metrics.get("mismatch_ratio_max")) + (f" ({masked} masked)" if masked else "")


def behaviour_table(rows: list[tuple[int, int, dict[str, float | None]]], *, last: int = 4) -> Table:
    """The last few steps' behaviour (forge analyze's metrics; docs/analyze.md defines them)."""
    table = Table(box=None, padding=(0, 1), show_edge=False)
    for name, justify in (("step", "right"), ("n", "right"), ("verified", "right"), ("tools", "right"),
                          ("recovered", "right"), ("gave up", "right")):
        table.add_column(name, justify=justify, style="dim" if name in ("step", "n") else None)
    for step, n, m in rows[-last:]:
        pct = lambda v: "-" if v is None else f"{v * 100:.0f}%"  # noqa: E731
        table.add_row(str(step), str(n), pct(m["self_verified"]), _fmt(m["tool_calls"], ".1f"),
                      pct(m["error_recovery"]), pct(m["gave_up"]))
    return table


class RewardChart(PlotextPlot):
    """Reward mean and pass rate over train steps."""

    def show(self, snap: Snapshot) -> None:
        plt = self.plt
        plt.clear_data()
        plt.title("reward / pass rate by step")
        points = [(s.step, s.reward_mean, s.pass_rate) for s in snap.steps]  # numbered from 0, as the store
        if points:
            xs = [p[0] for p in points]
            plt.plot(xs, [p[1] or 0.0 for p in points], label="reward", marker="braille")
            plt.plot(xs, [p[2] or 0.0 for p in points], label="pass rate", marker="braille")
            plt.ylim(0, max(1.0, *(p[1] or 0.0 for p in points)))
            plt.xticks(xs if len(xs) <= 12 else xs[:: len(xs) // 12 + 1])  # steps are whole numbers
        self.refresh()


def sync_table(table: DataTable, rows: list[tuple[str, list[Any]]]) -> None:
    """Show `rows` (key, cells) without losing the cursor: update in place when the keys are the same."""
    keys = [key for key, _ in rows]
    have = [row.key.value for row in table.ordered_rows]
    if keys == have:
        columns = list(table.columns)
        for key, cells in rows:
            for col, cell in zip(columns, cells):
                table.update_cell(key, col, cell)
        return
    # A cursor on the top row stays there (newest first: it follows the news); one the user moved
    # down stays on its row while new rows arrive above it.
    row = table.cursor_row
    selected = have[row] if have and 0 < row < len(have) else None
    table.clear()
    for key, cells in rows:
        table.add_row(*cells, key=key)
    if selected in keys:
        table.move_cursor(row=keys.index(selected))


def rollout_detail(r: Rollout) -> Text:
    """The rollout under the cursor in one or two lines: how it ended and, if it failed, why."""
    text = Text.assemble((r.id, "bold"), f"  {r.task_id}  sample {r.sample_index}  ", _status(r.status))
    if r.reward is not None:
        text.append(f"  reward {r.reward:.2f}")
    if r.error:
        kind = f" ({r.failure_kind})" if r.failure_kind else ""
        text.append(f"\n{'why' if r.status == 'failed' else 'note'}{kind}: {r.error}",
                    style="red" if r.status == "failed" else "")
    return text


class CallScreen(ModalScreen[None]):
    """One recorded call: the rendered conversation, its tokens, its tool calls, its images."""

    BINDINGS: ClassVar = [Binding("escape", "dismiss", "back"), Binding("enter", "dismiss", "back", show=False)]

    def __init__(self, call: Call, images: ImageStore | None = None) -> None:
        super().__init__()
        self.call = call
        self.images = images  # the run's image files (None: not known, listed by id only)

    def compose(self) -> ComposeResult:
        c = self.call
        prompt_ids = c.prompt_ids or []
        completion_ids = c.completion_ids or []
        head = Text.assemble(
            (f"call {c.id}", "bold"), f"  {c.api}  rollout {c.rollout_id}  seq {c.seq}  ", _status(c.status),
            f"\nmodel {c.model}  adapter {c.adapter or 'base'}  stream {c.stream}  finish {c.finish_reason or '-'}",
            f"\ntokens: prompt {c.prompt_tokens or len(prompt_ids)} (reused {c.reused_tokens}), "
            f"completion {c.completion_tokens or len(completion_ids)}   latency {_fmt(c.latency_ms, '.0f')} ms",
        )
        if c.error:
            head.append(f"\nerror: {c.error}", style="bold red")
        with Vertical(id="call-box"):
            yield Static(head, id="call-head")
            with VerticalScroll(id="conversation"):
                for role, text in conversation(c):
                    block = Static(Text(text or "(empty)"), classes=f"turn role-{role.split()[0]}")
                    block.border_title = role
                    yield block
                tools = c.tool_calls_json or []
                if tools or c.tool_parse_error:
                    body = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
                    if c.tool_parse_error:
                        body += "\n(a malformed tool call was returned as text)"
                    block = Static(Text(body.strip()), classes="turn role-tools")
                    block.border_title = f"tool calls ({len(tools)})"
                    yield block
                if c.images:
                    block = Static(image_list(c.images, self.images), classes="turn role-images")
                    block.border_title = f"images ({len(c.images)}, in prompt order)"
                    yield block
            yield Static("escape: back", classes="hint")


def image_list(shas: list[str], images: ImageStore | None) -> Text:
    """One line per image: its id prefix, format, size, dimensions (`forge calls --show` saves them)."""
    text = Text()
    for i, sha in enumerate(shas):
        info = images.describe(sha) if images is not None else ImageInfo(sha, None)
        where = f"{info.format}  {info.size:,} bytes  {info.dimensions}" if info.path else "file not found"
        text.append(("\n" if i else "") + f"#{i}  {sha[:12]}  {where}")
    return text


HELP = """\
[b]q[/]        quit (stops the engine, proxy, rollouts and sandboxes this run started)
[b]p[/]        pause / resume new rollouts
[b]enter[/]    open the selected call: its conversation, tokens and tool calls
[b]tab[/]      move between the rollouts and calls tables
[b]?[/]        this help
[b]escape[/]   close a window

`forge dash RUN` opens this view read-only from another terminal."""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar = [Binding("escape", "dismiss", "close"), Binding("question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(HELP, id="help-text")
            yield Static("escape: close", classes="hint")


class Dashboard(App[None]):
    CSS_PATH = "dashboard.tcss"
    TITLE = "forge"
    BINDINGS: ClassVar = [
        Binding("q", "stop", "quit"),
        Binding("ctrl+c", "stop", "quit", show=False, priority=True),
        Binding("p", "pause", "pause/resume"),
        Binding("question_mark", "help", "help"),
    ]

    def __init__(self, store: Store, run_id: str, *, controller: Controller | None = None,
                 log_path: Path | None = None, exit_after_done_s: float | None = None) -> None:
        super().__init__()
        self.store, self.run_id, self.controller = store, run_id, controller
        self.log_path = log_path
        self.exit_after_done_s = exit_after_done_s
        self.snapshot: Snapshot | None = None
        self._log_offset = 0
        self._exit_scheduled = False
        self._last_error: str | None = None
        self._behaviour_key: tuple[int, str] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="header")
        with Horizontal(id="top"):
            with Vertical(id="left"):
                yield DataTable(id="rollouts", cursor_type="row", zebra_stripes=True)
                yield Static(id="rollout-detail")
            with Vertical(id="side"):
                yield RewardChart(id="chart")
                yield Static(id="metrics")
                yield Static(id="async")  # shown for an asynchronous run only (trainer.max_staleness > 0)
                yield Static(id="behaviour")
        with Horizontal(id="bottom"):
            yield DataTable(id="calls", cursor_type="row", zebra_stripes=True)
            yield RichLog(id="log", max_lines=2000, wrap=True, markup=False, min_width=20)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "read-only" if self.controller is None else "live"
        rollouts = self.query_one("#rollouts", DataTable)
        rollouts.add_columns("rollout", "task", "step", "state", "time", "calls", "tokens", "reward")
        rollouts.border_title = "rollouts"
        calls = self.query_one("#calls", DataTable)
        calls.add_columns("call", "rollout", "api", "state", "prompt", "compl", "ms", "finish")
        calls.border_title = "latest calls (enter opens)"
        self.query_one("#metrics", Static).border_title = "last step"
        self.query_one("#async", Static).border_title = "asynchronous: versions in flight, staleness, buffer"
        self.query_one("#behaviour", Static).border_title = "behaviour by step (forge analyze)"
        self.query_one("#log", RichLog).border_title = "log"
        self.refresh_state()
        self.set_interval(POLL_S, self.refresh_state)

    def refresh_state(self) -> None:
        try:
            snap = read_snapshot(self.store, self.run_id)
        except ForgeError as exc:  # e.g. the store locked past its busy timeout: keep the last view
            if str(exc) != self._last_error:
                self._last_error = str(exc)
                self.notify(f"cannot read the run store: {exc}", severity="error")
            return
        self._last_error = None
        self.snapshot = snap
        try:
            self._show(snap)
        except NoMatches:  # the app is closing and its widgets are already gone
            return
        if snap.run.status in RUN_FINAL and self.exit_after_done_s is not None and not self._exit_scheduled:
            self._exit_scheduled = True
            self.set_timer(self.exit_after_done_s, self.exit)

    def _show(self, snap: Snapshot) -> None:
        paused = self.controller.paused if self.controller is not None else None
        self.query_one("#header", Static).update(header_text(snap, paused=paused))
        self.query_one("#metrics", Static).update(metrics_table(snap))
        self.query_one(RewardChart).show(snap)
        panel = async_panel(snap)
        box = self.query_one("#async", Static)
        box.display = panel is not None
        if panel is not None:
            box.update(panel)
        sync_table(self.query_one("#rollouts", DataTable), [
            (r.id, [r.id, r.task_id, str(r.step), _status(r.status), _duration(r.started_at, r.ended_at, snap.now),
                    str(r.n_calls), str(r.n_tokens), _fmt(r.reward, ".2f")])
            for r in snap.rollouts
        ])
        sync_table(self.query_one("#calls", DataTable), [
            (str(c.id), [str(c.id), c.rollout_id, API_SHORT.get(c.api, c.api), _status(c.status), str(c.prompt_tokens),
                         str(c.completion_tokens), _fmt(c.latency_ms, ".0f"), c.finish_reason or "-"])
            for c in snap.calls
        ])
        self._show_behaviour(snap)
        self._tail_log()

    def _show_behaviour(self, snap: Snapshot) -> None:
        # Reads every call of the run: only when a step (or the run) ended, not on every poll.
        key = (len(snap.steps), snap.run.status)
        if key == self._behaviour_key:
            return
        self._behaviour_key = key
        try:
            rows = behaviour_over_steps(self.store, self.run_id)
        except ForgeError:
            return
        self.query_one("#behaviour", Static).update(behaviour_table(rows) if rows else Text("no scored rollouts yet",
                                                                                           style="dim"))

    def _tail_log(self) -> None:
        path = self.log_path or run_log_path(self.store.path, self.run_id)
        try:
            with open(path, "rb") as fh:
                fh.seek(self._log_offset)
                data = fh.read(256 * 1024)
        except OSError:
            return
        # Only whole lines: a writer may be half-way through one.
        end = data.rfind(b"\n") + 1
        self._log_offset += end
        log = self.query_one("#log", RichLog)
        for line in data[:end].decode("utf-8", "replace").splitlines():
            log.write(line)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "rollouts" and event.row_key.value is not None:
            try:
                detail = self.query_one("#rollout-detail", Static)
            except NoMatches:  # the app is closing and its widgets are already gone
                return
            try:
                text = rollout_detail(self.store.get_rollout(str(event.row_key.value)))
            except ForgeError as exc:  # e.g. the store locked past its busy timeout
                text = Text(f"cannot read the rollout: {exc}", style="red")
            detail.update(text)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "calls" and event.row_key.value is not None:
            call = self.store.get_call(int(event.row_key.value))
            self.push_screen(CallScreen(call, ImageStore.for_run(self._home(), call.run_id)))

    def _home(self) -> Path:
        """The data dir the store lives in (`home/forge.db`), whose runs/ hold the images."""
        path = self.store.path
        return path.parent if isinstance(path, Path) else forge_home()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_pause(self) -> None:
        if self.controller is None:
            self.notify("read-only view: pause from the terminal that runs `forge up`", severity="warning")
            return
        if self.snapshot is not None and self.snapshot.run.status in RUN_FINAL:
            self.notify(f"the run is {self.snapshot.run.status}", severity="warning")
            return
        if self.controller.paused:
            self.controller.resume()
            self.notify("rollouts resumed")
        else:
            self.controller.pause()
            self.notify("rollouts paused: the ones in flight finish, no new ones start")
        self.refresh_state()

    def action_stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
        self.exit()


def make_dashboard(store_path: str | Path, run_id: str, *, controller: Controller | None = None,
                   exit_after_done_s: float | None = None) -> Dashboard:
    """The dashboard of one run (`run_id` may be a unique prefix or `latest`)."""
    store = Store(store_path)
    run = store.get_run(run_id)
    return Dashboard(store, run.id, controller=controller, exit_after_done_s=exit_after_done_s)
