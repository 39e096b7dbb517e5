"""docs/performance.md is generated from bench/results: never edited by hand, never out of date."""

import json

from bench import __main__ as bench


def test_performance_doc_is_the_generators_output():
    assert bench.DOC.read_text() == bench.render_doc(), \
        "docs/performance.md differs from bench/results: run `python -m bench report` (never edit the page)"


def test_every_result_file_has_a_section_with_its_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    (tmp_path / "trainer.json").write_text(json.dumps({
        "name": "trainer", "when": "2026-12-04 10:00:00 UTC", "quick": False,
        "machine": {"platform": "Linux", "cpus": 2, "torch": "2.13"},
        "results": {"ratio_tokens_per_s": 1.2345, "trl": {"peak_mib": 20.0}}}))
    (tmp_path / "proxy@2026-12-03.json").write_text(json.dumps({
        "when": "2026-12-03 16:52:55 UTC", "machine": {}, "note": "kept for its LiteLLM row",
        "results": {"systems": {"direct": {"p50": 0.5}, "litellm": {"p50": 16.0}}}}))
    (tmp_path / "proxy.json").write_text(json.dumps({"when": "2026-12-05 09:00:00 UTC", "machine": {},
                                                     "results": {"systems": {"direct": {"p50": 0.4}}}}))
    (tmp_path / "parsers.json").write_text(json.dumps({"rows": [{"template": "qwen3", "ok": True},
                                                                {"template": "qwen2.5", "ms": 1.5}]}))
    page = bench.render_doc()
    titles = [line for line in page.splitlines() if line.startswith("## ")]
    # the prepared GPU check (bench/gpu/prepared.md) first, then one section per result file
    assert titles == ["## GPU (prepared)", "## proxy", "## proxy@2026-12-03", "## trainer", "## parsers"]
    assert "| ratio_tokens_per_s | 1.234 |" in page and "| trl.peak_mib | 20 |" in page
    assert "Note: kept for its LiteLLM row" in page and "| litellm | 16.00 ms |" in page
    assert "| template | ok | ms |\n|---|---|---|\n| qwen3 | True |  |\n| qwen2.5 |  | 1.5 |" in page
    assert "When and where it was measured is not recorded in the file." in page
