"""`forge analyze`: what agents did, measured from their recorded transcripts.

    behaviour.py   behaviour metrics of one rollout (turns, tool calls, coverage, ...)
    analyze.py     those metrics grouped by harness, step or task, with bootstrap confidence intervals
    html.py        the report as one static HTML file
"""
