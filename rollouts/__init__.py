"""Rollouts: an agent program (a harness) doing a task in a sandbox, graded, recorded. By concern:

    tasks/       what an agent is asked to do and how it is graded: the task format and its loader
                 (format.py), exact grading on the host (grading.py), the self-check of a task set's
                 graders (selfcheck.py), the built-in text tasks (builtin/) and GUI sites (web/)
    harnesses/   the agent programs: the Harness protocol (base.py), one adapter a module, the npm
                 installs (npm.py) and the in-sandbox agents forge ships (mini_agent.py, ...)
    runner/      running them: RolloutRunner (runner.py), a rollout's calls as training sequences
                 (trajectory.py) and as steps (transcript.py), pass@k / pass^k (metrics.py), evals
    analysis/    `forge analyze`: behaviour metrics per rollout, grouped with bootstrap CIs, as HTML

Dependencies point down this list's reverse: runner uses tasks and harnesses; analysis reads what the
runner stored; nothing here imports the trainer or the CLI.
"""
