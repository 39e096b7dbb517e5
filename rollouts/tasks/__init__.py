"""Tasks: what an agent is asked to do, what its sandbox starts with, and how it is scored.

    format.py      the task format (JSONL or a folder), `load_tasks`, the built-in sets by name
    grading.py     exact checks on the host: expected answer, expected files (never a substring)
    harbor.py      Harbor / Terminal-Bench task folders read as tasks (task.toml, Dockerfile, tests/)
    harbor_verifier.py  a Harbor task's tests run after the agent is gone; its reward file read on the host
    selfcheck.py   `forge tasks validate --run`: a set's reference solutions pass, hostile answers score 0
    builtin/       the built-in text tasks (easy, medium, hard) and the script that writes them
    web/           GUI tasks: the `builtin-web` sites served per rollout and their state graders
"""
