"""docs/performance.md's side-by-side table of a bench that measured several systems in one run."""

from bench.__main__ import systems_table


def test_systems_table_adds_latency_over_direct_and_leaves_missing_figures_blank():
    systems = {"direct": {"p50": 0.5, "cpu_ms_c1": 0.2, "rps": 4000.0, "cpu_ms": 0.1, "ttfc": 0.6},
               "forge": {"p50": 2.0, "cpu_ms_c1": 1.5, "rps": 812.4, "cpu_ms": 1.2, "ttfc": 2.25},
               "forge-w2": {"rps": 861.0, "cpu_ms": 1.54}}
    header, rule, direct, forge, workers = systems_table(systems)
    assert header.startswith("| system | p50, c=1 | added p50, c=1 |") and rule.count("|---") == 7
    assert direct == "| direct | 0.50 ms |  | 0.20 ms | 4,000 | 0.10 ms |  |"
    assert forge == "| forge | 2.00 ms | 1.50 ms | 1.50 ms | 812 | 1.20 ms | 1.65 ms |"
    assert workers == "| forge-w2 |  |  |  | 861 | 1.54 ms |  |"


def test_systems_table_without_a_direct_row_has_no_added_figures():
    (_, _, row) = systems_table({"forge": {"p50": 2.0, "ttfc": 2.5}})
    assert row == "| forge | 2.00 ms |  |  |  |  |  |"
