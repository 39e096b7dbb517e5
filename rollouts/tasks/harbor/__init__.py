"""The Harbor / Terminal-Bench family (docs/tasks.md, "Harbor / Terminal-Bench tasks").

    folder.py      Harbor task folders read as tasks (task.toml, instruction.md, environment/, tests/)
    image.py       `forge tasks import harbor`: each task's Dockerfile built into its image
    dockerfile.py  the one reading of its Dockerfile: steps, each step's WORKDIR, what each COPY brings
    compose.py     its docker-compose.yaml services beside `main`, run by the Docker backend (sandbox/compose.py)
    mcp.py         its [[environment.mcp_servers]] as task MCP servers (what forge cannot run refused in one line)
    steps.py       a multi-step task's [[steps]]: one instruction, one verifier and one gate per step
    verifier.py    its tests run after the agent is gone; its reward file read on the host
    payload.py     its part of a task record (TaskSpec.family, kind "harbor"): its tests, or its steps
    kind.py        the family's TaskKind: tests as the grader, steps driven, its attacks under validate --run
"""
