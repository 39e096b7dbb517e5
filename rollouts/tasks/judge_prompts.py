"""The judges of the field, by name: their published prompts' criteria and verdict formats.

A task's judge (`JudgeSpec.name`) is forge's own rubric judge (`rubric`, rollouts/tasks/judge.py) or
one of these, written from the evaluation code each benchmark published:

- `webvoyager`: WebVoyager's automatic evaluation (He et al., 2024), the GPT-4V judge of
  github:MinorJerry/WebVoyager evaluation/auto_eval.py (commit 5a7896738c10, `SYSTEM_PROMPT` and
  `USER_PROMPT`): the task, the agent's response and the last screenshots; a verdict SUCCESS or
  NOT SUCCESS.
- `webjudge`: Online-Mind2Web's WebJudge (Xue et al., 2025, "An Illusion of Progress?"), the outcome
  judgement of github:OSU-NLP-Group/Online-Mind2Web src/methods/webjudge_online_mind2web.py
  (`WebJudge_Online_Mind2Web_eval`'s system message, its seven evaluation criteria): the task, the
  agent's final answer, its action history (rollouts/runner/transcript.py `action_history`) and the
  screenshots; a last line `Status: "success"` or `Status: "failure"`.
  WebJudge proper runs two model stages before that one (key points of the task, a relevance score
  per screenshot); forge makes the outcome call only, on the last N screenshots, so one judgement is
  one call (docs/tasks.md, "Named judges").

The prompts are the published criteria in the published order, reworded (not copied) and followed by
forge's data-quoting paragraph (judge.py): the agent's text and screenshots come after them, quoted.
Parsing is stricter than the originals (WebVoyager counts any reply containing SUCCESS; WebJudge
looks for "success" after "Status:"): the verdict must be the reply's last non-blank line and the only
line that looks like one, as for the rubric judge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class VerdictError(ValueError):
    """A judge's reply without exactly one well-formed verdict line as its last line."""


@dataclass(frozen=True)
class NamedJudge:
    """A judge of the field: its prompt, the form of its verdict, and how the verdict scores."""

    name: str
    system: str
    task_heading: str
    answer_heading: str
    screenshots_heading: str
    reply_format: str  # what the last line must be, as the prompt says it
    shows_actions: bool  # the published judge reads the agent's action history
    claim: re.Pattern[str]  # a line that looks like a verdict (exactly one allowed)
    verdict: re.Pattern[str]  # the well-formed verdict line, group 1 the verdict
    scores: dict[str, float]

    def parse(self, reply: str) -> float:
        """The score of `reply`'s verdict; VerdictError unless its last non-blank line is the only line
        that looks like a verdict and is well formed."""
        lines = [line.strip() for line in reply.splitlines() if line.strip()]
        claims = [line for line in lines if self.claim.match(line)]
        if len(claims) != 1:
            raise VerdictError(f"{len(claims)} verdict lines, want exactly one ({self.reply_format})")
        if lines[-1] != claims[0]:
            raise VerdictError("the verdict line is not its last line")
        if not (m := self.verdict.fullmatch(claims[0])):
            raise VerdictError(f"want {self.reply_format}, got {claims[0][:100]!r}")
        return self.scores[m.group(1)]


# evaluation/auto_eval.py SYSTEM_PROMPT (WebVoyager), its three inputs and six notes, reworded.
WEBVOYAGER = NamedJudge(
    name="webvoyager",
    system=(
        "As an evaluator, you are given three things:\n\n"
        "1. Web Task Instruction: a directive in natural language describing an online activity to carry "
        "out (a search, checking information, comparing prices, checking availability, or any other action "
        "on a web service).\n"
        "2. Result Screenshots: what the screen showed at the end of performing the task, the visual proof "
        "of the actions taken.\n"
        "3. Result Response: the text the agent answered when it finished browsing.\n\n"
        "-- You do not interact with web pages or perform any action yourself.\n"
        "-- Do not assume anything the screenshots do not show when you compare them with the instruction.\n"
        "-- Your job is to assess the instruction against the outcome shown in the screenshots and in the "
        "response: do the actions taken match what the instruction asked?\n"
        "-- An instruction may hold several tasks (for example, find a garage and summarise its reviews); "
        "failing any one of them, such as giving no summary, is unsuccessful.\n"
        "-- The screenshots are authentic; the response was written by the agent at the end, and it may "
        "disagree with the screenshots.\n"
        "-- Where the response contradicts a screenshot, the screenshot prevails; where the response says "
        "something no screenshot mentions, believe the response.\n\n"
        "Explain how you reach your evaluation, then give a definitive verdict on whether the task was "
        "accomplished: SUCCESS or NOT SUCCESS."),
    task_heading="TASK",
    answer_heading="Result Response",
    screenshots_heading="screenshots at the end",
    shows_actions=False,
    reply_format="a last line holding only SUCCESS or NOT SUCCESS",
    claim=re.compile(r"^\W*(?:verdict\W*)?(?:not\s+)?success\b", re.I),
    verdict=re.compile(r"(?:Verdict: )?(SUCCESS|NOT SUCCESS)"),
    scores={"SUCCESS": 1.0, "NOT SUCCESS": 0.0},
)

# src/methods/webjudge_online_mind2web.py, WebJudge_Online_Mind2Web_eval's system message, reworded:
# the same seven criteria, the same two-line reply (Thoughts, then Status).
WEBJUDGE = NamedJudge(
    name="webjudge",
    system=(
        "You are an expert in evaluating the performance of a web navigation agent, which helps a human "
        "user navigate a website to complete a task. Given the user's task, the agent's action history and "
        "snapshots of web pages from the agent's trajectory, decide whether the agent completed the task and "
        "met all of its requirements.\n\n"
        "Follow these evaluation criteria strictly:\n"
        "1: Filtered results must be displayed correctly. If a filter was not properly applied (not "
        "selected, not confirmed, or with no visible effect on the results), the task is not successful.\n"
        "2: Check carefully whether the snapshots and the action history meet each key point of the task. "
        "Conditions such as best, highest, cheapest, latest, most recent, lowest, closest, highest-rated, "
        "largest and newest must be applied with the site's filter or sort function.\n"
        "3: Requirements that a filter can apply must be applied by the filter; a search that merely types "
        "every requirement into the query is a failure, since it cannot guarantee that the results meet "
        "them.\n"
        "4: A range of money, years, or a number of beds or bathrooms must be filtered exactly as required, "
        "neither broader nor narrower: a filter of less than $25 for a requirement of less than $50 fails; "
        "$2000-$2500 for $1500-$2500 fails; $0-$200 for $25-$200 fails; 2001-2012 for 2004-2012 fails; "
        "2000-2014 for before 2015 fails; 2+ beds for exactly 2 beds fails.\n"
        "5: Some tasks need a submission, or the results displayed, to count as successful.\n"
        "6: If the information found is empty or invalid (for example, no match was found) but the agent "
        "performed the required actions correctly, the task is still successful.\n"
        "7: If the page already shows every available item, no filter is needed: choosing items that meet "
        "the requirement (for example, the cheapest) is still successful.\n\n"
        "Format your reply as two lines:\n"
        "Thoughts: <your reasoning, checking each key point and the criteria>\n"
        'Status: "success" or "failure"'),
    task_heading="User Task",
    answer_heading="The agent's final answer",
    screenshots_heading="snapshots of the web page from the end of the agent's trajectory",
    shows_actions=True,
    reply_format='a last line Status: "success" or Status: "failure"',
    claim=re.compile(r"^\W*status\b", re.I),
    verdict=re.compile(r'Status: "?(success|failure)"?'),
    scores={"success": 1.0, "failure": 0.0},
)

NAMED_JUDGES: dict[str, NamedJudge] = {j.name: j for j in (WEBVOYAGER, WEBJUDGE)}
