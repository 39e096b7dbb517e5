"""`forge analyze --html OUT`: the report as one static HTML file, no script and no dependency.

    html = report_html(report, step_curves(report.rollouts))

The file holds the same table as the terminal (each group's mean with its 95% bootstrap interval, the
change columns, pass@k and pass^k) and, when the rollouts span two or more steps, one small inline-SVG
chart per metric: the mean at every step with its 95% bootstrap band. It opens in any browser, offline.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from openforge.rollouts.analysis.analyze import METRICS, Estimate, Report, bootstrap_mean
from openforge.rollouts.analysis.behaviour import Behaviour

RATES = {"tool_coverage", "self_verified", "error_recovery", "plan_completion", "gave_up"}
CURVE_RESAMPLES = 500  # per step and metric: a chart's band, not a published interval


@dataclass
class Curve:
    metric: str
    points: list[tuple[int, Estimate]]  # (step, estimate) for the steps where the metric is defined


def step_curves(rows: Sequence[Behaviour], metrics: Sequence[str] = METRICS) -> list[Curve]:
    """Each metric's mean and bootstrap interval at every step of these rollouts."""
    by_step: dict[int, list[Behaviour]] = {}
    for b in rows:
        by_step.setdefault(b.step, []).append(b)
    curves = []
    for m in metrics:
        points = []
        for step, bs in sorted(by_step.items()):
            values = [float(v) for b in bs if (v := getattr(b, m)) is not None]
            if values:
                points.append((step, bootstrap_mean(values, resamples=CURVE_RESAMPLES)))
        curves.append(Curve(m, points))
    return curves


def _fmt(metric: str, value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "-"
    if metric in RATES or metric.startswith("pass"):
        return f"{value * 100:{'+' if signed else ''}.1f}%"
    return f"{value:{'+' if signed else ''}.2f}"


def _cell(metric: str, est: Estimate, *, signed: bool = False) -> str:
    text = _fmt(metric, est.mean, signed=signed)
    if est.mean is not None and est.lo is not None and est.hi is not None and est.n >= 2:
        text += f' <span class="ci">[{_fmt(metric, est.lo)}, {_fmt(metric, est.hi)}]</span>'
    return text


def _table(report: Report) -> str:
    head = ["metric", *[f"{html.escape(g.key)}<br><small>n={g.n_rollouts}</small>" for g in report.groups],
            *[f"change<br><small>{html.escape(c.other)} &minus; {html.escape(c.base)}</small>" for c in report.changes]]
    rows = []
    for k in (report.groups[0].pass_at if report.groups else {}):
        for label, attr in ((f"pass@{k}", "pass_at"), (f"pass^{k}", "pass_hat")):
            rows.append([label, *[_fmt("pass", getattr(g, attr)[k]) for g in report.groups],
                         *["" for _ in report.changes]])
    for m in METRICS:
        rows.append([m, *[_cell(m, g.metrics[m]) for g in report.groups],
                     *[_cell(m, c.metrics[m], signed=True) for c in report.changes]])
    out = ["<table>", "<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows]
    return "\n".join(out + ["</table>"])


W, H, PAD = 300, 160, 34


def _svg(curve: Curve) -> str:
    """A line of the means over steps and a shaded band of the intervals, axes labelled with the ranges."""
    pts = [(s, e) for s, e in curve.points if e.mean is not None]
    lows = [e.lo if e.lo is not None else e.mean for _, e in pts]
    highs = [e.hi if e.hi is not None else e.mean for _, e in pts]
    y0, y1 = min(lows), max(highs)  # type: ignore[type-var]
    if curve.metric in RATES:
        y0, y1 = 0.0, 1.0
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    s0, s1 = pts[0][0], pts[-1][0]

    def x(step: int) -> float:
        return PAD + (W - 2 * PAD) * ((step - s0) / (s1 - s0) if s1 > s0 else 0.5)

    def y(v: float) -> float:
        return H - PAD + (2 * PAD - H) * (v - y0) / (y1 - y0)

    band = [(x(s), y(hi)) for (s, _), hi in zip(pts, highs)] + [(x(s), y(lo)) for (s, _), lo in
                                                               reversed(list(zip(pts, lows)))]
    line = " ".join(f"{x(s):.1f},{y(e.mean):.1f}" for s, e in pts)  # type: ignore[arg-type]
    dots = "".join(f'<circle cx="{x(s):.1f}" cy="{y(e.mean):.1f}" r="2.5"><title>step {s}: '  # type: ignore[arg-type]
                   f'{_fmt(curve.metric, e.mean)} (n={e.n})</title></circle>' for s, e in pts)
    return (f'<svg class="curve" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" '
            f'aria-label="{curve.metric} by step">'
            f'<text x="{W / 2}" y="14" text-anchor="middle" class="title">{curve.metric}</text>'
            f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" class="axis"/>'
            f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" class="axis"/>'
            f'<text x="{PAD - 4}" y="{y(y1) + 4:.1f}" text-anchor="end">{_fmt(curve.metric, y1)}</text>'
            f'<text x="{PAD - 4}" y="{y(y0) + 4:.1f}" text-anchor="end">{_fmt(curve.metric, y0)}</text>'
            f'<text x="{x(s0):.1f}" y="{H - PAD + 14}" text-anchor="middle">{s0}</text>'
            + (f'<text x="{x(s1):.1f}" y="{H - PAD + 14}" text-anchor="middle">{s1}</text>' if s1 != s0 else "")
            + f'<text x="{W / 2}" y="{H - 6}" text-anchor="middle">step</text>'
            f'<polygon class="band" points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in band)}"/>'
            f'<polyline class="mean" points="{line}"/>{dots}</svg>')


STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin-bottom:2em}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}.ci{color:#777;font-size:85%}
svg.curve{margin:4px;border:1px solid #eee}svg text{font-size:10px;fill:#444}svg .title{font-size:12px;fill:#222}
.axis{stroke:#999}.band{fill:#4a7bd0;fill-opacity:.18;stroke:none}.mean{fill:none;stroke:#4a7bd0;stroke-width:2}
circle{fill:#4a7bd0}"""


def report_html(report: Report, curves: Sequence[Curve] = ()) -> str:
    title = f"forge analyze: {', '.join(report.runs)} by {report.by}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             "<p>Each cell: mean over the group's sampled rollouts [95% percentile-bootstrap interval]. "
             "Definitions: docs/analyze.md.</p>", _table(report)]
    for g in report.groups:
        if g.break_reasons:
            reasons = ", ".join(f"{html.escape(r)} &times;{n}" for r, n in g.break_reasons.items())
            parts.append(f"<p>prefix breaks in {html.escape(g.key)}: {reasons}</p>")
    drawn = [c for c in curves if len(c.points) >= 2]
    if drawn:
        parts.append("<h2>By step</h2><p>Mean at each step, with its 95% bootstrap band.</p><div>")
        parts += [_svg(c) for c in drawn]
        parts.append("</div>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
