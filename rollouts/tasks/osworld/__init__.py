"""The OSWorld-format family (docs/tasks.md, "OSWorld-format tasks").

    importer.py    `forge tasks import osworld`: OSWorld-format JSON tasks (config steps, evaluator) as forge tasks
    finish.py      the save step run on the display after the agent (OSWorld's postconfig)
    evaluator.py   their evaluator after the agent: getters in the sandbox, OSWorld's metric on the host
    metric.py      one OSWorld metric function (the desktop-env package's own) in a child process
    payload.py     its part of a task record (TaskSpec.family, kind "osworld"): its evaluator and its desktop
    kind.py        the family's TaskKind: a desktop task graded by its evaluator, junk planted under validate --run
"""
