"""forge_cli/staleness.py: `forge show`'s line for an asynchronous run, read from each step's metrics."""

from __future__ import annotations

from types import SimpleNamespace

from openforge.forge_cli.staleness import is_async, staleness_line


def _step(**metrics: object) -> SimpleNamespace:
    return SimpleNamespace(metrics_json=metrics)


def test_the_line_sums_every_step_and_reports_the_last_ones_buffer() -> None:
    steps = [_step(staleness={"0": 4}, stale_waits=1, failed_groups=0, buffer_depth=2),
             _step(staleness={"0": 2, "1": 2}, stale_waits=0, failed_groups=1, buffer_depth=1,
                   versions_in_flight={"3": 2, "2": 1})]
    assert staleness_line(steps) == ("async: groups by versions behind 0:6 1:2; steps that waited on a group at "
                                     "the bound 1; groups dropped as failed 1; at the last step: buffer depth 1, "
                                     "in flight v2:1 v3:2")


def test_a_synchronous_run_has_no_line() -> None:
    assert staleness_line([_step(loss=0.1), SimpleNamespace(metrics_json=None)]) is None
    assert is_async({"trainer": {"max_staleness": 2}})
    assert not is_async({"trainer": {"max_staleness": 0}}) and not is_async({})
