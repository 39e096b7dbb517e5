"""`forge analyze`: what agents did, measured from their recorded transcripts.

    behaviour.py   behaviour metrics of one rollout (turns, tool calls, coverage, ...)
    analyze.py     those metrics grouped by harness, step or task, with bootstrap confidence intervals
    eval_figures.py  an eval's pass@k / pass^k per harness with bootstrap intervals over tasks, and two
                   evals' difference paired by task (`forge eval --harness a,b --compare RUN`)
    html.py        the report as one static HTML file
"""
