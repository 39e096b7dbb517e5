"""A small agent forge does not ship: the OpenAI SDK, one `bash` tool, and the answer on the last line of
its output. It knows nothing of forge: the base URL, key and model come from the usual variables.

    python hello_agent.py --max-turns 4 "Write hello into greeting.txt"
"""

import argparse
import json
import os
import subprocess
import sys

from openai import OpenAI

BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command and return its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("task")
    args = parser.parse_args()
    client = OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY
    messages = [{"role": "system", "content": "Use bash to do the task, then reply with a short final answer."},
                {"role": "user", "content": args.task}]
    for _ in range(args.max_turns):
        reply = client.chat.completions.create(model=os.environ["HELLO_MODEL"], messages=messages,
                                               tools=[BASH], max_tokens=256).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            print((reply.content or "").strip().replace("\n", " "))  # the answer: the last line of stdout
            return 0
        for call in reply.tool_calls:
            try:
                command = json.loads(call.function.arguments)["command"]
                done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
                output = (done.stdout + done.stderr)[-2000:]
            except Exception as exc:  # a malformed call is answered, not fatal
                output = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    print("hello-agent: turn limit reached", file=sys.stderr)
    return 3  # its own limit: the policy did not finish in time


if __name__ == "__main__":
    sys.exit(main())
