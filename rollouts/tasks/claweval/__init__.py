"""The ClawEval family (docs/tasks.md, "ClawEval tasks").

    importer.py    `forge tasks import claweval`: a claw-eval checkout's tasks as forge tasks
    grading.py     ClawEval's own grader.py and scoring (safety x (0.8 completion + 0.2 robustness), pass^N)
                   run on the host on the trace forge recorded
    score.py       that grader run for one rollout from forge's records (its verdict stored); ClawEval's figures
    payload.py     its part of a task record (TaskSpec.family, kind "claweval"): its grader.py and scoring
    kind.py        the family's TaskKind: its own grader as the reward, its figures in an eval's summary
"""
