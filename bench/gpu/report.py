"""The GPU check's record (bench/gpu/main.py) as one markdown table, each figure beside its same-run
baseline, the ratio and the issue's target (issue 48), then every part's status, time and peak memory."""

from __future__ import annotations

from typing import Any


def _n(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "—"


def figures(results: dict) -> list[tuple[str, str, str, str, str, str]]:
    """(what, unit, forge, baseline, ratio, target) rows of whatever parts ran."""
    rows = []
    for name, part in results.items():
        if name.startswith("decode ") and isinstance(part, dict):
            for row in part.get("rows", []):
                b = row["batch"]
                rows.append((f"{name.removeprefix('decode ')} decode, batch {b}", "tokens/s (engine vs model.generate)",
                             _n(row["engine_tokens_per_s"]), _n(row["generate_tokens_per_s"]),
                             _ratio(row["engine_tokens_per_s"], row["generate_tokens_per_s"]), "≥ 1.5x" if b >= 8 else ""))
    cache = results.get("prefix cache")
    if cache:
        on, off = cache["cache_on"], cache["cache_off"]
        what = f"prefix cache, group of {cache['group']} x {cache['prompt_tokens']:,} tokens"
        rows.append((what, "prefill tokens computed (on vs off)", _n(on["prefill_tokens_computed"]),
                     _n(off["prefill_tokens_computed"]), _ratio(off["prefill_tokens_computed"], on["prefill_tokens_computed"])
                     + " fewer", "≥ 5x fewer"))
        rows.append((what, "group wall s (on vs off)", _n(on["wall_s"]), _n(off["wall_s"]),
                     _ratio(off["wall_s"], on["wall_s"]) + " faster", ""))
    ours, trl, fsdp = results.get("grpo step forge"), results.get("grpo step trl"), results.get("grpo step forge fsdp2")
    if ours:
        theirs = trl or {}
        rows.append(("GRPO step (LoRA, demo loss) vs TRL GRPOTrainer", "train tokens/s", _n(ours["tokens_per_s"]),
                     _n(theirs.get("tokens_per_s")), _ratio(ours["tokens_per_s"], theirs.get("tokens_per_s")), "≥ 1.5x"))
        rows.append(("GRPO step vs TRL", "peak MiB over the loaded model", _n(ours["peak_mib"]), _n(theirs.get("peak_mib")),
                     _ratio(ours["peak_mib"], theirs.get("peak_mib")), "≤ 1x"))
        m = ours["mismatch"]
        dtype = (results.get("grpo batch") or {}).get("engine_dtype", "?")
        rows.append((f"engine ({dtype}) / trainer logprob gap", "max / mean \\|Δ logp\\|",
                     f"{_n(m['mismatch_max'])} / {_n(m['mismatch_mean'])}", "", "", ""))
        w, t = m["without_tis"], m["with_tis"]
        rows.append(("importance weight π/μ without TIS", "max / mean \\|w − 1\\|",
                     f"{_n(w['weight_max'])} / {_n(w['mean_abs_weight_minus_1'])}", "", "", ""))
        rows.append((f"importance weight with TIS (cap {t['cap']})", "max / mean \\|w − 1\\| / capped share",
                     f"{_n(t['weight_max'])} / {_n(t['mean_abs_weight_minus_1'])} / {_n(t['capped_share'])}", "", "", ""))
    if fsdp and ours:
        rows.append(("GRPO step under torchrun FSDP2, 1 GPU, vs one process", "train tokens/s", _n(fsdp["tokens_per_s"]),
                     _n(ours["tokens_per_s"]), _ratio(fsdp["tokens_per_s"], ours["tokens_per_s"]), ""))
    hot = results.get("lora hot-load")
    if hot:
        rows.append(("LoRA hot-load into the engine (AdapterSync)", "ms median / max / first request",
                     f"{_n(hot['median_ms'])} / {_n(hot['max_ms'])} / {_n(hot['first_request_ms'])}", "", "", ""))
    return rows


def markdown(record: dict) -> str:
    res = record["results"]
    m = res.get("machine", {})
    where = "a dry run: toy sizes on the CPU, the numbers mean nothing" if record.get("quick") else \
        f"{m.get('gpu')} ({m.get('gpu_memory_gib')} GiB), driver {m.get('driver')}"
    lines = [f"# GPU check, {record['when']}", "",
             f"{where}; torch {m.get('torch')} (CUDA {m.get('cuda')}), transformers {m.get('transformers')}, "
             f"peft {m.get('peft')}, trl {m.get('trl')}, Python {m.get('python')}. Total {res.get('total_wall_s')} s.", "",
             "| what | figure | forge | baseline | ratio | target |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in figures(res)]
    lines += ["", "| part | status | wall s | peak GPU GiB |", "|---|---|---|---|"]
    lines += [f"| {p['part']} | {p['status']} | {_n(p.get('wall_s'))} | {_n(p.get('peak_gib'))} |" for p in res.get("parts", [])]
    return "\n".join(lines) + "\n"
