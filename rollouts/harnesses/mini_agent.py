"""The `mini` agent: a compact tool-calling ReAct loop on the OpenAI SDK, run inside a sandbox.

Standalone (stdlib + `openai`, and agent_files.py, which the harness copies beside it): the mini harness
copies this file into the sandbox and runs it as

    python mini_agent.py --instruction-file .forge/instruction.txt --max-turns 8 --max-tokens 256

with OPENAI_BASE_URL, OPENAI_API_KEY and FORGE_MODEL set. Each turn the model either calls tools
(bash, read_file, write_file; results go back as `tool` messages) or answers in plain text, which
ends the loop. The final answer is written to .forge/answer.txt for the verifier.

A task's own tools (rollouts/tasks/tools.py) come from the rollout's MCP server on the host, named by
FORGE_MCP_URL (streamable HTTP) and FORGE_MCP_TOKEN: listed once at the start and offered beside the
three built-in ones as native function tools; each call is an MCP `tools/call` (`McpTools`, stdlib).

A random-weight policy emits nonsense: bad JSON arguments, unknown tools, empty turns. None of it may
crash the agent: a bad tool call gets an error as its result, an API error ends the loop, and the
answer file is always written. Exit codes: 0 finished, 3 the API failed, 4 no `openai`, 5 an agent bug,
6 the conversation outgrew the model's context (the API's `context_length_exceeded`: the policy's doing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

try:  # in the sandbox: the harness put agent_files.py beside this script
    from agent_files import ANSWER_FILE, write_afresh
except ImportError:  # imported from the package (tests, warm-up)
    from openforge.rollouts.harnesses.agent_files import ANSWER_FILE, write_afresh

TOOL_OUTPUT_CHARS = 4000  # what one tool result may add to the context
CONTEXT_FULL = 6  # the exit code when the conversation outgrew the model's context
SYSTEM = ("You are an agent in a sandbox. Use the tools to act in the working directory. "
          "When the task is done, reply with your final answer as plain text without tool calls.")
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "bash", "description": "Run a shell command; returns exit code and output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a text file (parents are created).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
]


class McpTools:
    """The task's tools on its MCP server: streamable HTTP, one JSON-RPC request a POST (stdlib only)."""

    PROTOCOL = "2025-06-18"

    def __init__(self, url: str, token: str, *, timeout: float = 120.0) -> None:
        self.url, self.token, self.timeout = url, token, timeout
        self.session: str | None = None
        self.names: set[str] = set()
        self._id = 0

    def _post(self, method: str, params: dict[str, Any] | None = None, *, notify: bool = False) -> Any:
        import urllib.request

        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, **({"params": params} if params else {})}
        if not notify:
            self._id += 1
            message["id"] = self._id
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "Authorization": f"Bearer {self.token}"}
        if self.session:
            headers |= {"Mcp-Session-Id": self.session, "MCP-Protocol-Version": self.PROTOCOL}
        request = urllib.request.Request(self.url, data=json.dumps(message).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            self.session = response.headers.get("Mcp-Session-Id") or self.session
            body = response.read().decode("utf-8", "replace")
            kind = response.headers.get("Content-Type", "")
        if notify:
            return None
        if kind.startswith("text/event-stream"):  # the answer is the last `data:` event
            body = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")][-1]
        reply = json.loads(body)
        if "error" in reply:
            raise ValueError(f"MCP {method}: {reply['error'].get('message', reply['error'])}")
        return reply["result"]

    def open(self) -> list[dict[str, Any]]:
        """Initialize the session; the server's tools as Chat Completions function tools."""
        self._post("initialize", {"protocolVersion": self.PROTOCOL, "capabilities": {},
                                  "clientInfo": {"name": "forge-mini", "version": "1"}})
        self._post("notifications/initialized", notify=True)
        tools = self._post("tools/list")["tools"]
        self.names = {t["name"] for t in tools}
        return [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                  "parameters": t.get("inputSchema") or {"type": "object"}}}
                for t in tools]

    def call(self, name: str, args: dict[str, Any]) -> str:
        result = self._post("tools/call", {"name": name, "arguments": args})
        text = "\n".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
        return f"error: {text}" if result.get("isError") and not text.startswith("error") else text


def _clip(text: str) -> str:
    if len(text) <= TOOL_OUTPUT_CHARS:
        return text
    half = TOOL_OUTPUT_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - TOOL_OUTPUT_CHARS} characters cut ...]\n{text[-half:]}"


def _arg(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise ValueError(f"argument {name!r} must be a string")
    return value


def run_tool(name: str, raw_args: str | None, *, bash_timeout: float, mcp: McpTools | None = None) -> str:
    """The result text of one tool call; never raises (errors are results the model can read)."""
    try:
        args = json.loads(raw_args or "{}")
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
        if mcp is not None and name in mcp.names:
            return _clip(mcp.call(name, args))
        if name == "bash":
            done = subprocess.run(_arg(args, "command"), shell=True, capture_output=True, text=True,
                                  timeout=bash_timeout, errors="replace", stdin=subprocess.DEVNULL)
            return _clip(f"exit code {done.returncode}\n{done.stdout}{done.stderr}")
        if name == "read_file":
            return _clip(Path(_arg(args, "path")).read_text(encoding="utf-8", errors="replace"))
        if name == "write_file":
            path = Path(_arg(args, "path"))
            content = _arg(args, "content")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
            return f"wrote {len(content)} characters to {path}"
        known = ", ".join(["bash", "read_file", "write_file", *sorted(mcp.names if mcp else ())])
        return f"error: unknown tool {name!r}; the tools are {known}"
    except subprocess.TimeoutExpired:
        return f"error: command timed out after {bash_timeout:g}s"
    except (ValueError, OSError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        return f"error: {type(exc).__name__}: {exc}"


def _assistant_message(msg: Any) -> dict[str, Any]:
    """The assistant turn as it goes back into the history (only the fields the API accepts)."""
    out: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
    if msg.tool_calls:
        out["tool_calls"] = [{"id": tc.id, "type": "function",
                              "function": {"name": tc.function.name, "arguments": tc.function.arguments or "{}"}}
                             for tc in msg.tool_calls]
    return out


def agent_loop(client: Any, model: str, instruction: str, *, max_turns: int, max_tokens: int,
               bash_timeout: float, mcp: McpTools | None = None) -> tuple[str, int]:
    """Run the ReAct loop; returns (final answer, exit code)."""
    import openai

    tools = TOOLS + (mcp.open() if mcp is not None else [])

    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]
    answer = ""
    for turn in range(max_turns):
        try:
            resp = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=max_tokens)
        except openai.OpenAIError as exc:
            print(f"mini: turn {turn}: API error: {exc}", file=sys.stderr)
            context_full = isinstance(exc, openai.BadRequestError) and exc.code == "context_length_exceeded"
            return answer, CONTEXT_FULL if context_full else 3
        if not resp.choices:
            print(f"mini: turn {turn}: response without choices", file=sys.stderr)
            return answer, 3
        msg = resp.choices[0].message
        answer = msg.content or answer
        print(f"mini: turn {turn}: {len(msg.tool_calls or [])} tool call(s), {len(msg.content or '')} chars of text")
        if not msg.tool_calls:
            return msg.content or "", 0
        messages.append(_assistant_message(msg))
        for tc in msg.tool_calls:
            result = run_tool(tc.function.name, tc.function.arguments, bash_timeout=bash_timeout, mcp=mcp)
            print(f"mini:   {tc.function.name} -> {result[:120]!r}")
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": result})
    print(f"mini: stopped after {max_turns} turns without a final answer")
    return answer, 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instruction-file", required=True)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--bash-timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    instruction = Path(args.instruction_file).read_text(encoding="utf-8")
    try:
        import openai
    except ImportError:
        print(f"mini: the python at {sys.executable} has no `openai` package", file=sys.stderr)
        return 4
    # One retry only: the proxy is local, and a retried call is a duplicate turn for training.
    client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"],
                           max_retries=1, timeout=float(os.environ.get("FORGE_CALL_TIMEOUT", "300")))
    answer, code = "", 5
    mcp = McpTools(os.environ["FORGE_MCP_URL"], os.environ.get("FORGE_MCP_TOKEN", "")) \
        if os.environ.get("FORGE_MCP_URL") else None
    try:
        answer, code = agent_loop(client, os.environ.get("FORGE_MODEL", "forge-policy"), instruction,
                                  max_turns=args.max_turns, max_tokens=args.max_tokens,
                                  bash_timeout=args.bash_timeout, mcp=mcp)
    except Exception as exc:  # noqa: BLE001 - an agent bug must still leave an answer file and an exit code
        print(f"mini: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        client.close()
        write_afresh(ANSWER_FILE, answer + ("\n" if answer and not answer.endswith("\n") else ""))
    return code


if __name__ == "__main__":
    sys.exit(main())
