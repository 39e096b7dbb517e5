"""The real harnesses against each shipped chat template: Claude Code and Codex (their npm packages,
run unsandboxed on this machine) do one tool call and answer through the recording proxy, the
scripted engine writing as each family writes (Qwen3: thinking + JSON call; Qwen3-Coder: XML call;
Qwen2.5: JSON call). Per pair: the harness's exit, the file its tool wrote, the calls recorded (the
tool parsed, no parse error), how many sampled tokens the second call reused, and the segments.

    python -m bench.parsers_harnesses   # the harnesses from $FORGE_NPM_CACHE (a:b: several) or ~/.cache/openforge-npm
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

# npm caches to look in, in order (`:`-separated, like PATH)
CACHES = [Path(p).expanduser() for p in (os.environ.get("FORGE_NPM_CACHE") or
                                         str(Path.home() / ".cache" / "openforge-npm")).split(":")]
MARK = "FORGE_TOOL_RAN"
COMMAND = "printf 'forge-ok\\n' > proof.txt && printf 'FORGE_%s\\n' TOOL_RAN"  # only the output holds MARK
ANSWER = "Done: proof.txt is written."
HARNESS_TOOL = {"claude-code": ("Bash", "command"), "codex": ("exec_command", "cmd")}


def _written(template: str, tool: str, param: str, prompt: str) -> str:
    think = "<think>\n{}\n</think>\n\n" if template == "qwen3" else ""
    if MARK in prompt:
        return think.format("It ran.") + ANSWER
    if template == "qwen3-coder":
        return (f"I'll write it.\n\n<tool_call>\n<function={tool}>\n<parameter={param}>\n{COMMAND}\n</parameter>\n"
                "</function>\n</tool_call>")
    call = json.dumps({"name": tool, "arguments": {param: COMMAND}})
    return think.format("I need to write proof.txt.") + f"I'll write it.\n<tool_call>\n{call}\n</tool_call>"


async def _one(template: str, harness: str, tmp: Path, cache: Path) -> dict[str, Any]:
    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.engine.tiny import build_tiny_model
    from openforge.config import HarnessConfig, LocalSandboxConfig, ProxyConfig
    from openforge.store import Store
    from openforge.proxy.server import ProxyServer
    from openforge.rollouts.harnesses.base import HarnessContext
    from openforge.rollouts.harnesses import get_harness
    from openforge.rollouts.runner.trajectory import assemble_rollout
    from openforge.sandbox.factory import make_sandbox

    model = build_tiny_model(tmp / f"{template}-{harness}", template=template)
    store = Store(tmp / f"{template}-{harness}.db")
    engine = ScriptedEngine(model, [])
    tool, param = HARNESS_TOOL[harness]
    engine.script = lambda ids: _written(template, tool, param, engine.tokenizer.decode(ids))
    es = serve_in_thread(engine.app)
    run = store.create_run(kind="proxy")
    ro = store.create_rollout(run_id=run.id, task_id="t", status="running")
    proxy = ProxyServer(ProxyConfig(max_context_tokens=400_000), store_path=store.path, engine_url=es.url,
                        model_path=model).start()
    try:
        adapter = get_harness(HarnessConfig(name=harness, npm_cache=str(cache)))
        async with make_sandbox(LocalSandboxConfig(isolation="none"), run_id=run.id, rollout_id=ro.id) as sb:
            ctx = HarnessContext(proxy_url=proxy.url, api_key=ro.key, model="forge-policy",
                                 instruction="Write forge-ok into proof.txt, then say you are done.",
                                 workdir=sb.info.workdir, backend=sb.info.backend)
            await adapter.prepare(sb, ctx)
            t0 = time.perf_counter()
            res = await sb.exec(adapter.command(ctx), env=adapter.env(ctx), timeout=150)
            secs = time.perf_counter() - t0
            try:
                proof = (await sb.read_file("proof.txt")).decode()
            except Exception:  # noqa: BLE001 - a missing file is the result
                proof = ""
        calls = [c for c in store.list_calls(rollout_id=ro.id) if c.status == "ok"]
        stats = assemble_rollout(store, ro.id)
        return {"template": template, "harness": harness, "exit": res.exit_code, "tool_ran": proof == "forge-ok\n",
                "calls": len(calls), "tools_parsed": [t["name"] for c in calls for t in c.tool_calls_json or []],
                "parse_errors": sum(bool(c.tool_parse_error) for c in calls),
                "reused_by_last": calls[-1].reused_tokens if calls else None,
                "first_completion_tokens": calls[0].completion_tokens if calls else None,
                "breaks": [c.break_reason for c in calls if c.break_reason], "segments": stats["n_segments"],
                "seconds": round(secs, 1), "stderr": res.stderr[-300:] if res.exit_code else ""}
    finally:
        proxy.stop()
        es.stop()
        store.close()


def run(quick: bool = False) -> dict[str, Any]:
    from openforge.rollouts.harnesses import npm_harness
    from openforge.rollouts.harnesses.npm import find_package_bin

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for harness in HARNESS_TOOL:
            cache = next((c for c in CACHES if find_package_bin(c, harness, npm_harness(harness)) is not None), None)
            if cache is None:
                print(f"{harness}: not installed in {':'.join(map(str, CACHES))}, skipped")
                continue
            for template in ("qwen2.5", "qwen3", "qwen3-coder"):
                row = asyncio.run(_one(template, harness, Path(tmp), cache))
                rows.append(row)
                print(json.dumps(row))
    return {"rows": rows}


if __name__ == "__main__":
    result = run()
    out = Path(__file__).resolve().parent / "results" / "parsers_harnesses.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    from bench.__main__ import write_doc  # docs/performance.md shows every result file

    write_doc()
