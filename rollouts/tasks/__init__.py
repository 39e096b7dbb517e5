"""Tasks: what an agent is asked to do, what its sandbox starts with, and how it is scored.

    kinds.py       task families as plugins: the `TaskKind` protocol (a family's display, sandbox config, probes,
                   steps, graders, figures, attacks, importer, description), the registry by name (and the
                   entry-point group `openforge.task_kinds`), `kind_of(task)`: the one place a task's family is decided
    format.py      the task format (JSONL or a folder), `load_tasks`, the built-in sets by name
    setup_files.py a task's setup files as bytes: text `files`, base64 `binary_files`, a folder's files/
    grading.py     exact checks on the host: expected answer, expected files (never a substring)
    judge.py       a task's judge component: a model's verdict by a rubric, the agent's text and screens quoted
    judge_prompts.py  the judges of the field by name (WebVoyager, WebJudge): prompts and strict verdicts
    tools.py       a task's own tools (a host command or a service call), served over MCP per rollout
    mcp_servers.py a task's own MCP servers (stdio on the host, or a service), their tools served beside those
    selfcheck.py   `forge tasks validate --run`: a set's reference solutions pass, hostile answers score 0
    services.py    task services: mock APIs started on the host per rollout behind a recording front
                   (every request recorded by forge, errors injected by seed), graded by `expect_requests`
    service_front.py  that recording front: the service's only way in, served in forge's own process

One folder per family, each with its `kind.py` (its TaskKind):

    harbor/        Harbor / Terminal-Bench task folders: read as tasks, images built, tests as the grader, [[steps]]
    osworld/       `forge tasks import osworld`: OSWorld-format JSON tasks, their evaluator and metric
    claweval/      `forge tasks import claweval`: a claw-eval checkout's tasks, ClawEval's own grader and figures
    desktop/       a desktop task: the programs it needs and the start script run on its display before the agent
    web/           GUI tasks: the `builtin-web` sites served per rollout and their state graders, web benchmarks
    gsm8k/         GSM8K-style question files imported as exact-number tasks (docs/tasks.md, "Adding a task format")
    builtin/       the built-in text tasks (easy, medium, hard) and the script that writes them
    arith/         the generated arithmetic family (train and held-out splits)
"""
