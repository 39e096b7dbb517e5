"""Tasks: what an agent is asked to do, what its sandbox starts with, and how it is scored.

    kinds.py       task families as plugins: the `TaskKind` protocol (a family's display, sandbox config, probes,
                   steps, graders, figures, importer, description), the registry by name (and the entry-point
                   group `openforge.task_kinds`), `kind_of(task)`: the one place a task's family is decided
    harbor_kind.py, osworld_kind.py, claweval_kind.py, desktop_kind.py, web/kind.py  the shipped families' kinds
    format.py      the task format (JSONL or a folder), `load_tasks`, the built-in sets by name
    setup_files.py a task's setup files as bytes: text `files`, base64 `binary_files`, a folder's files/
    grading.py     exact checks on the host: expected answer, expected files (never a substring)
    judge.py       a task's judge component: a model's verdict by a rubric, the agent's text and screens quoted
    judge_prompts.py  the judges of the field by name (WebVoyager, WebJudge): prompts and strict verdicts
    harbor.py      Harbor / Terminal-Bench task folders read as tasks (task.toml, Dockerfile, tests/)
    harbor_verifier.py  a Harbor task's tests run after the agent is gone; its reward file read on the host
    harbor_mcp.py  a Harbor task's [[environment.mcp_servers]] as task MCP servers (what forge cannot run
                   refused in one line)
    harbor_compose.py  its docker-compose.yaml services beside `main`, run by the Docker backend (sandbox/compose.py)
    harbor_dockerfile.py  the one reading of its Dockerfile: steps, each step's WORKDIR, what each COPY brings
    tools.py       a task's own tools (a host command or a service call), served over MCP per rollout
    mcp_servers.py a task's own MCP servers (stdio on the host, or a service), their tools served beside those
    selfcheck.py   `forge tasks validate --run`: a set's reference solutions pass, hostile answers score 0
    services.py    task services: mock APIs started on the host per rollout behind a recording front
                   (every request recorded by forge, errors injected by seed), graded by `expect_requests`
    service_front.py  that recording front: the service's only way in, served in forge's own process
    claweval.py    `forge tasks import claweval`: a claw-eval checkout's tasks as forge tasks
    osworld.py     `forge tasks import osworld`: OSWorld-format JSON tasks (config steps, evaluator) as forge tasks
    osworld_eval.py  their evaluator after the agent: getters in the sandbox, OSWorld's metric on the host
    osworld_metric.py  one OSWorld metric function (the desktop-env package's own) in a child process
    desktop.py     a desktop task: the programs it needs and the start script run on its display before the agent
    claweval_grading.py  ClawEval's own grader.py and scoring (safety x (0.8 completion + 0.2 robustness), pass^N)
                   run on the host on the trace forge recorded
    claweval_score.py  that grader run for one rollout from forge's records (its verdict stored); ClawEval's
                   figures of an eval
    builtin/       the built-in text tasks (easy, medium, hard) and the script that writes them
    web/           GUI tasks: the `builtin-web` sites served per rollout and their state graders
    arith/         the generated arithmetic family (train and held-out splits)
    gsm8k/         GSM8K-style question files imported as exact-number tasks (docs/tasks.md, "Adding a task format")
"""
