"""The desktop family (docs/gui.md, "Desktop applications").

    task.py        a desktop task: the programs it needs and the start script run on its display before the agent
    payload.py     its part of a task record (TaskSpec.family, kind "desktop")
    kind.py        the family's TaskKind: the display opened, its applications probed before the agent
"""
