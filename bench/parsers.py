"""The model families on the real harnesses: the captured Claude Code, Codex and OpenClaw requests
(docs/harness-captures/) replayed through the proxy against a tiny model carrying each shipped chat
template (engine/templates), the scripted engine answering as that family writes (Qwen3: thinking,
then a JSON call; Qwen3-Coder: an XML call; Qwen2.5: a JSON call) with a call to one of the tools the
harness offered. Per template and capture: served or not, the call and the thinking as the harness's
API returns them (streamed, as the harnesses ask), the prompt's tokens, the proxy's latency.

And the parsers' own cost: a write_file call parsed as it streams (4 characters per feed, finer
than the engine's deltas), 64 KiB against 16 KiB (the baseline, measured in the same run): a ratio
near 4 shows the streamed parse stays linear in the call's length.

    python -m bench.parsers [--quick]      # prints a table; writes bench/results/parsers.json
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CAPTURES = ROOT / "docs" / "harness-captures"
RESULTS = ROOT / "bench" / "results" / "parsers.json"
TEMPLATES = ("qwen2.5", "qwen3", "qwen3-coder")
END = {"/v1/messages": "event: message_stop", "/v1/responses": "event: response.completed",
       "/v1/chat/completions": "data: [DONE]"}


def _tools(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for t in body.get("tools") or []:
        if "input_schema" in t:
            out.append((t["name"], t["input_schema"]))
        elif t.get("type") == "function":
            fn = t.get("function", t)
            out.append((fn["name"], fn.get("parameters") or {}))
        elif t.get("type") == "namespace":
            out += [(m["name"], m.get("parameters") or {}) for m in t.get("tools", []) if m.get("type") == "function"]
    return out


def _shell_call(body: dict[str, Any]) -> tuple[str, str]:
    """The harness's shell tool and its command parameter (the first tool with a required string)."""
    for name, schema in _tools(body):
        props = schema.get("properties") or {}
        for p in schema.get("required") or []:
            if (props.get(p) or {}).get("type") == "string":
                return name, p
    raise ValueError("no tool with a required string parameter")


def _answer(template: str, tool: str, param: str) -> str:
    if template == "qwen3-coder":
        return f"I'll look.\n\n<tool_call>\n<function={tool}>\n<parameter={param}>\nls -la\n</parameter>\n</function>\n</tool_call>"
    call = f'<tool_call>\n{{"name": "{tool}", "arguments": {{"{param}": "ls -la"}}}}\n</tool_call>'
    think = "<think>\nThe user wants the files listed.\n</think>\n\n" if template == "qwen3" else ""
    return f"{think}I'll look.\n{call}"


def _seen(path: str, sse: str) -> dict[str, Any]:
    """What the harness got from the stream: thinking, the tool call (name, arguments)."""
    thinking, calls, args = "", [], {}
    for line in sse.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if path == "/v1/messages":
            if ev.get("type") == "content_block_start" and ev["content_block"]["type"] == "tool_use":
                calls.append([ev["content_block"]["name"], ""])
            delta = ev.get("delta") or {}
            thinking += delta.get("thinking", "") if delta.get("type") == "thinking_delta" else ""
            if delta.get("type") == "input_json_delta":
                calls[-1][1] += delta["partial_json"]
        elif path == "/v1/responses":
            if ev.get("type") == "response.completed":
                for item in ev["response"]["output"]:
                    if item["type"] == "function_call":
                        calls.append([item["name"], item["arguments"]])
                    if item["type"] == "reasoning":
                        thinking += "".join(p["text"] for p in item.get("content") or [])
        else:
            for choice in ev.get("choices") or []:
                d = choice.get("delta") or {}
                thinking += d.get("reasoning_content") or ""
                for tc in d.get("tool_calls") or []:
                    if tc.get("id"):
                        calls.append([tc["function"]["name"], ""])
                    args[tc["index"]] = args.get(tc["index"], "") + (tc["function"].get("arguments") or "")
    for i, c in enumerate(calls):
        c[1] = args.get(i, c[1])
    return {"thinking": thinking, "calls": [(n, json.loads(a)) for n, a in calls]}


async def _replay(model: Path, template: str, store_path: Path, captures: list[tuple[str, dict]]) -> list[dict]:
    import httpx
    from transformers import AutoTokenizer

    from openforge.engine.client import EngineClient
    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.config import ProxyConfig
    from openforge.store import Store
    from openforge.proxy.app import create_app

    store = Store(store_path)
    run = store.create_run(kind="proxy")
    answers: list[str] = []
    engine = ScriptedEngine(model, lambda ids: answers.pop(0))
    rows = []
    with serve_in_thread(engine.app) as es:
        app = create_app(ProxyConfig(), store_path=store.path, engine=EngineClient(es.url, timeout=60),
                         tokenizer=AutoTokenizer.from_pretrained(str(model)))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy",
                                     timeout=120) as http:
            for name, req in captures:
                ro = store.create_rollout(run_id=run.id, task_id="t", status="running")
                tool, param = _shell_call(req["body"])
                answers.append(_answer(template, tool, param))
                headers = {k: v for k, v in req["headers"].items() if k in ("anthropic-version", "accept")}
                headers["authorization"] = f"Bearer {ro.key}"
                t0 = time.perf_counter()
                resp = await http.post(req["path"], headers=headers, json=req["body"])
                wall = (time.perf_counter() - t0) * 1000
                ok = resp.status_code == 200 and END[req["path"]] in resp.text
                seen = _seen(req["path"], resp.text) if ok else {"thinking": "", "calls": []}
                call = store.list_calls(rollout_id=ro.id)
                rows.append({"template": template, "capture": name, "status": resp.status_code, "complete": ok,
                             "tool_call_ok": seen["calls"] == [(tool, {param: "ls -la"})],
                             "thinking_ok": (seen["thinking"] == "The user wants the files listed.")
                             == (template == "qwen3"),
                             "prompt_tokens": call[0].prompt_tokens if call else None, "ms": round(wall, 1),
                             "error": None if ok else resp.text[:200]})
        await app.state.proxy.aclose()
    store.close()
    return rows


def _parse_speed(quick: bool) -> dict[str, Any]:
    """A write_file call of 16 and 64 KiB parsed as it streams, 4 characters per feed: 4x the text
    should cost 4x the time (linear; a parser that rescans its buffer on every feed costs 16x)."""
    from openforge.proxy.parsing import OutputParser, ParserSetup, parse_output

    def texts(kib: int) -> dict[str, tuple[str, str]]:
        content = ("def f(x):\n    return x + 1  # \"quoted\" {braces} <b>\n" * 4000)[:kib * 1024]
        call = json.dumps({"name": "write_file", "arguments": {"path": "a.py", "content": content}})
        return {"qwen25": (content, f"Writing.\n<tool_call>\n{call}\n</tool_call>"),
                "qwen3_coder": (content, "Writing.\n<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n"
                                         f"</parameter>\n<parameter=content>\n{content}\n</parameter>\n</function>\n"
                                         "</tool_call>")}

    def timed(kind: str, content: str, text: str) -> tuple[float, float]:
        setup = ParserSetup(kind, "qwen3")
        one, streamed = [], []
        for _ in range(3 if quick else 7):
            t0 = time.perf_counter()
            parse_output(text, setup)
            one.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            p = OutputParser(setup)
            for i in range(0, len(text), 4):
                p.feed(text[i:i + 4])
            p.finish()
            streamed.append(time.perf_counter() - t0)
            assert p.calls and p.calls[0].arguments["content"] == content
        return statistics.median(one) * 1000, statistics.median(streamed) * 1000

    out = {}
    small, large = texts(16), texts(64)
    for kind in small:
        one16, s16 = timed(kind, *small[kind])
        one64, s64 = timed(kind, *large[kind])
        out[kind] = {"streamed_16k_ms": round(s16, 1), "streamed_64k_ms": round(s64, 1),
                     "us_per_feed_64k": round(s64 * 1000 / (len(large[kind][1]) / 4), 2),
                     "one_shot_64k_ms": round(one64, 2), "ratio_64k_vs_16k": round(s64 / s16, 2)}
    return out


def run(quick: bool = False) -> dict[str, Any]:
    from openforge.engine.tiny import build_tiny_model

    captures = [(f.stem, json.loads(line)) for f in sorted(CAPTURES.glob("*.jsonl")) for line in f.open()]
    captures = [(n, r) for n, r in captures if r["method"] == "POST"]
    if quick:
        captures = [next(c for c in captures if c[0] == h) for h in ("claude-code", "codex", "openclaw-chat")]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for template in TEMPLATES:
            model = build_tiny_model(Path(tmp) / template, template=template)
            rows += asyncio.run(_replay(model, template, Path(tmp) / f"{template}.db", captures))
    print(f"{'template':12} {'capture':20} {'served':7} {'call':5} {'thinking':9} {'prompt tok':>10} {'ms':>8}")
    for r in rows:
        print(f"{r['template']:12} {r['capture']:20} {str(r['complete']):7} {str(r['tool_call_ok']):5} "
              f"{str(r['thinking_ok']):9} {r['prompt_tokens'] or '-':>10} {r['ms']:>8}")
        if r["error"]:
            print("   ", r["error"])
    speed = _parse_speed(quick)
    for kind, s in speed.items():
        print(f"parse {kind}: streamed 4 chars/feed: 16 KiB {s['streamed_16k_ms']} ms (baseline), 64 KiB "
              f"{s['streamed_64k_ms']} ms = {s['ratio_64k_vs_16k']}x ({s['us_per_feed_64k']} us/feed; one shot "
              f"{s['one_shot_64k_ms']} ms)")
    return {"harness_templates": rows, "parse_speed": speed}


if __name__ == "__main__":
    result = run(quick="--quick" in sys.argv)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    from bench.__main__ import write_doc  # docs/performance.md shows every result file

    write_doc()
