"""Running rollouts and reading them back.

    runner.py      RolloutRunner: (task, sample) pairs, each in its own sandbox, bounded, retried on
                   infrastructure failures only, graded on the host, recorded in the store
    harness_run.py one harness run (prepare, run under its limit, kill_all, record) and how it ended:
                   timed out, a harness failure, the policy's failure or an answer (runner.py, steps.py)
    grader.py      RolloutGrader: the exact graders, the verifier and a judge, after the agent is gone, as the
                   task's family (rollouts/tasks/kinds.py) asks
    steps.py       a multi-step task's rollout (a family's steps: Harbor's [[steps]]), each step graded after it
    trajectory.py  a rollout's recorded calls as training sequences (token ids, masks, logprobs)
    transcript.py  a rollout's recorded calls as what the agent did: tool steps, results, answer
    metrics.py     mean reward, pass@k and pass^k per task and per run
    failures.py    which rollouts failed for infra/harness reasons, their reasons, StepFailed
    evaluate.py    an eval: every task sampled k times, scored, summarised, stored as a run
    tool_server.py a task's tools as one MCP server per rollout on the host, every dispatch recorded
    mcp_upstream.py  its client sessions to the task's own MCP servers, whose tools it serves beside those
"""
