"""Runs browser-use (PyPI `browser-use`) on one task inside a sandbox and writes its own verdict.

Run with the python of the harness's venv (forge harness install browser-use):

    python browser_use_agent.py --instruction-file .forge/instruction.txt --max-steps 8 [--no-vision]

with OPENAI_BASE_URL (the proxy's /v1), OPENAI_API_KEY (the rollout's key), FORGE_MODEL and
FORGE_CHROMIUM (the browser to start; DISPLAY set: it runs headful there, else headless). browser-use
starts that Chromium itself and drives it over CDP; its LLM is its own ChatOpenAI pointed at the proxy.

The result is browser-use's own structured history (AgentHistoryList), written to
.forge/browser_use_result.json: `{"is_done", "is_successful", "final_result", "errors", "steps", "api_errors", "answered"}`;
the adapter reads that, never the log. Exit codes: 0 ran (done or not: the file says), 3 the model
API failed the run, 4 browser-use is not importable, 5 an agent bug or the browser failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

try:  # in the sandbox: the harness put agent_files.py beside this script
    from agent_files import write_afresh
except ImportError:  # imported from the package (tests, warm-up)
    from openforge.rollouts.harnesses.agent_files import write_afresh

RESULT_FILE = ".forge/browser_use_result.json"


def history_record(history: Any) -> dict[str, Any]:
    """What the adapter needs from an AgentHistoryList, JSON-ready."""
    return {"is_done": bool(history.is_done()), "is_successful": history.is_successful(),
            "final_result": history.final_result(), "errors": [e for e in history.errors() if e],
            "steps": history.number_of_steps()}


def forge_llm_class() -> Any:
    """browser-use's ChatOpenAI, noting each call the API itself failed (an HTTP error status or no
    connection: the harness's failure) apart from a reply browser-use could not use (invalid JSON, cut
    off, empty: the policy's, which browser-use reports back to it as a step error)."""
    import openai
    from browser_use import ChatOpenAI

    class ForgeChatOpenAI(ChatOpenAI):
        async def ainvoke(self, messages: Any, output_format: Any = None, **kwargs: Any) -> Any:
            try:
                reply = await super().ainvoke(messages, output_format, **kwargs)
            except Exception as exc:
                cause = exc.__cause__
                if isinstance(cause, openai.APIStatusError):
                    API_ERRORS.append(f"API error {cause.status_code}: {cause.message}"[:300])
                elif isinstance(cause, openai.APIConnectionError):
                    API_ERRORS.append(f"API connection failed: {cause}"[:300])
                else:
                    ANSWERED.append(1)  # a reply came, the policy's and unusable
                raise
            ANSWERED.append(1)
            return reply

    return ForgeChatOpenAI


API_ERRORS: list[str] = []
ANSWERED: list[int] = []  # one per call the API answered (usable or not)


async def run(instruction: str, *, max_steps: int, use_vision: bool, max_actions: int) -> dict[str, Any]:
    from browser_use import Agent, BrowserProfile, BrowserSession

    # One retry: the proxy is local, and a retried call is a duplicate turn for training.
    llm = forge_llm_class()(model=os.environ.get("FORGE_MODEL", "forge-policy"), base_url=os.environ["OPENAI_BASE_URL"],
                     api_key=os.environ["OPENAI_API_KEY"], max_retries=1,
                     timeout=float(os.environ.get("FORGE_CALL_TIMEOUT", "300")))
    home = Path(os.environ.get("HOME", ".")).resolve()
    profile = BrowserProfile(
        executable_path=os.environ["FORGE_CHROMIUM"], headless=not os.environ.get("DISPLAY"),
        user_data_dir=str(home / "browser-use-profile"), enable_default_extensions=False,
        # No sandbox of its own: the rollout's sandbox is the sandbox (chromium's needs user namespaces).
        chromium_sandbox=False, args=["--disable-gpu", "--no-first-run", "--disable-background-networking",
                                      "--disable-sync", "--disable-component-update"])
    # A GUI task's page (FORGE_START_URL), else its site (FORGE_SITE_URL): start there (browser-use
    # itself opens a URL written in the task instead).
    site = os.environ.get("FORGE_START_URL") or os.environ.get("FORGE_SITE_URL")
    start = [{"navigate": {"url": site, "new_tab": False}}] if site and "http" not in instruction else None
    agent = Agent(task=instruction, llm=llm, browser_session=BrowserSession(browser_profile=profile),
                  initial_actions=start,
                  use_vision=use_vision, max_actions_per_step=max_actions, calculate_cost=False,
                  generate_gif=False, max_failures=3, use_judge=False)
    history = await agent.run(max_steps=max_steps)
    return {**history_record(history), "api_errors": API_ERRORS, "answered": len(ANSWERED)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instruction-file", required=True)
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--max-actions", type=int, default=3, help="actions browser-use may take per model call")
    p.add_argument("--no-vision", dest="vision", action="store_false", help="send no screenshots")
    args = p.parse_args(argv)
    instruction = Path(args.instruction_file).read_text(encoding="utf-8")
    try:
        import browser_use  # noqa: F401
    except ImportError as exc:
        print(f"browser-use: not importable from {sys.executable}: {exc}", file=sys.stderr)
        return 4
    code = 5
    record: dict[str, Any] = {"error": "did not run"}
    try:
        record = asyncio.run(run(instruction, max_steps=args.max_steps, use_vision=args.vision,
                                 max_actions=args.max_actions))
        code = 0
    except Exception as exc:  # noqa: BLE001 - whatever broke, leave a result and an exit code
        from browser_use.llm.exceptions import ModelProviderError
        code = 3 if isinstance(exc, ModelProviderError) else 5
        record = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    write_afresh(RESULT_FILE, json.dumps(record))
    if code:
        print(f"browser-use: {record['error']}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
