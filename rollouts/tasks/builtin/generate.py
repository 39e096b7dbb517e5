"""Writes easy.jsonl, medium.jsonl and hard.jsonl: the built-in task set (`--tasks builtin`).

The JSONL files are what forge reads; this script is their source, because shell verifiers are far
easier to read here than JSON-escaped. Edit, then run `python rollouts/tasks/builtin/generate.py`.
Every task carries a reference `solution`; tests/rollouts/tasks/builtin/test_tasks_builtin.py proves each one scores 1 with
it and 0 for each of selfcheck.HOSTILE_ANSWERS (empty, digits, the alphabet, an error blob, the
instruction echoed, 1 MB of text).

Grading is exact (docs/tasks.md): an answer task compares the normalised final answer with
`expect_answer` (a number, a word sequence); a file task compares file contents with `expect_files`;
both are checked by the runner outside the sandbox. A shell `verifier` is used only where the state
must be exercised (run the agent's program, load its JSON); it runs Python with `-I` so a module the
agent left in the working directory is not imported, and runs the agent's code in a child process
so only the verifier's exit code or last line decides. Partial credit only in hard-fix-calc (per
bug fixed) and hard-log-report (per key right).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

HERE = Path(__file__).parent
ANSWER = ".forge/answer.txt"


def answer(text: str) -> str:
    """A solution that gives `text` as its final answer (the runner's script harness reads this file)."""
    return f"mkdir -p .forge && printf '%s\\n' '{text}' > {ANSWER}"


def number(value: float) -> dict:
    return {"number": value}


def words(text: str) -> dict:
    return {"words": text}


def py(code: str) -> str:
    return textwrap.dedent(code).lstrip()


# The agent's code, run by a verifier, has the verifier's powers: it could read the expected values
# out of the verifier's file (or rewrite an expected-output file) or out of its memory
# (/proc/<ppid>/mem: same user). So a verifier that runs it first makes itself non-dumpable and
# deletes its own file; what it expects lives only in its (now unreadable) memory.
KEEP_OUT = py("""
    import ctypes
    import os

    try:  # PR_SET_DUMPABLE = 4: no /proc/<this pid>/mem or environ for processes of the same user
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    os.remove(__file__)
    """)


# Runs expressions against the agent's module in one child interpreter: whatever the agent's code
# prints, or however it exits, only the reprs of the results on the child's stdout are compared.
# One child for all cases, with a generous limit: a verifier must not fail a right answer because a
# busy machine was slow to start Python.
CALL_HELPER = py("""
    import subprocess
    import sys
    """) + "\n" + KEEP_OUT + py("""


    def call_all(module, exprs):
        code = (f"import sys; sys.path.insert(0, '.')\\nfrom {module} import *\\n"
                f"for e in {exprs!r}:\\n"
                "    try:\\n        print(repr(eval(e)))\\n    except Exception:\\n        print('<error>')\\n")
        try:
            done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                                  timeout=40, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return [None] * len(exprs)
        got = done.stdout.splitlines() if done.returncode == 0 else []
        return got if len(got) == len(exprs) else [None] * len(exprs)
    """)


# `forge up --demo`'s tasks (tag `demo`): a line of one digit, and the question which digit it is, with
# the two possible answers named. Each answer is right on exactly one task, so a policy blind to the
# question scores at most 1/2 on them; the demo's warm-up (trainer/warmup/text.py) teaches the tiny model
# to answer one of the named digits, each equally often on either task: what is left to learn is which.
# The line is long (128 digits: ~250 of the ~840 tokens of mini's prompt) so that the question, not
# the harness prompt the tasks share, is what a ~0.1M-parameter model sees: with 32 digits (~10% of
# the prompt) the demo's two questions stayed too alike to learn apart in 12 steps.
DEMO_DIGITS = (3, 8)
DEMO_LINE_LENGTH = 128


def demo_digit_task(digit: int) -> dict:
    line = " ".join([str(digit)] * DEMO_LINE_LENGTH)
    options = " or ".join(str(d) for d in DEMO_DIGITS)
    return dict(id=f"demo-digit-{digit}", instruction=f"Which digit fills the line '{line}'? Answer with a number: {options}.",
                expect_answer=number(digit), solution=answer(str(digit)), tags=["answer", "demo"])


EASY = [
    dict(id="easy-say-hello", instruction="Answer with the two words: hello world",
         expect_answer=words("hello world"), solution=answer("hello world"), tags=["answer"]),
    dict(id="easy-say-done", instruction="Do nothing else; just answer with the single word: done",
         expect_answer=words("done"), solution=answer("done"), tags=["answer"]),
    dict(id="easy-true-false", instruction="Is 7 greater than 3? Answer true or false.",
         expect_answer=words("true"), solution=answer("true"), tags=["answer"]),
    dict(id="easy-yes-no", instruction="Does the file data.txt exist in your working directory? Answer yes or no.",
         files={"data.txt": "some data\n"}, expect_answer=words("yes"), solution=answer("yes"),
         tags=["answer", "files"]),
    dict(id="easy-sum", instruction="What is 2 + 3? Answer with the number.",
         expect_answer=number(5), solution=answer("5"), tags=["answer", "math"]),
    dict(id="easy-read-word", instruction="Read word.txt and answer with the word it contains.",
         files={"word.txt": "json\n"}, expect_answer=words("json"), solution=answer("json"),
         tags=["answer", "files"]),
    dict(id="easy-count-words", instruction="How many words are in the text 'the quick brown fox'? Answer with a number.",
         expect_answer=number(4), solution=answer("4"), tags=["answer", "math"]),
    dict(id="easy-list-tools", instruction="Which tools do you have? Answer with their names: bash, read_file, write_file.",
         expect_answer=words("bash read_file write_file"), solution=answer("bash, read_file, write_file"),
         tags=["answer"]),
    dict(id="easy-status-ok", instruction="Report your status: answer with the words status ok",
         expect_answer=words("status ok"), solution=answer("status ok"), tags=["answer"]),
    dict(id="easy-write-ok", instruction="Create a file named ok.txt whose content is the word ok.",
         expect_files={"ok.txt": "ok"}, solution="printf 'ok\\n' > ok.txt", tags=["files"]),
    *(demo_digit_task(d) for d in DEMO_DIGITS),
]

LOG = "INFO start\nERROR disk full\nINFO retry\nERROR disk full\nWARN slow\nERROR timeout\nINFO done\nERROR bad input\n"
NAMES = "mallory\nalice\ntrent\nbob\ncarol\n"
MEDIUM = [
    dict(id="med-create-file", instruction="Create a file hello.txt containing exactly the line: hello world",
         expect_files={"hello.txt": "hello world\n"}, solution="echo 'hello world' > hello.txt", tags=["files"]),
    dict(id="med-count-errors", instruction="Count the lines of log.txt that contain ERROR and write the number to count.txt.",
         files={"log.txt": LOG}, expect_files={"count.txt": "4\n"},
         solution="grep -c ERROR log.txt > count.txt", tags=["shell", "grep"]),
    dict(id="med-sort-names", instruction="Write the lines of names.txt in alphabetical order to sorted.txt.",
         files={"names.txt": NAMES}, expect_files={"sorted.txt": "alice\nbob\ncarol\nmallory\ntrent\n"},
         solution="sort names.txt > sorted.txt", tags=["shell"]),
    dict(id="med-edit-json", instruction="In config.json set \"port\" to 9090 and leave every other key as it is.",
         files={"config.json": json.dumps({"name": "app", "port": 8080, "debug": True}, indent=2) + "\n"},
         verifier="python3 -I -c \"import json; d = json.load(open('config.json')); "
                  "assert d == {'name': 'app', 'port': 9090, 'debug': True}, d\"",
         solution="python3 -c \"import json; d = json.load(open('config.json')); d['port'] = 9090; "
                  "json.dump(d, open('config.json', 'w'))\"", tags=["json", "python"]),
    dict(id="med-fix-add", instruction="add.py should print the sum of its two arguments but prints the wrong "
                                       "number. Fix it so that `python3 add.py 2 3` prints 5.",
         files={"add.py": py("""
             import sys
             a, b = int(sys.argv[1]), int(sys.argv[2])
             print(a - b)
             """)},
         # The program's output is captured by $(...); the test's exit code is the verdict.
         verifier="[ \"$(python3 add.py 2 3 </dev/null 2>/dev/null)\" = 5 ] && "
                  "[ \"$(python3 add.py 10 7 </dev/null 2>/dev/null)\" = 17 ]",
         solution="sed -i 's/a - b/a + b/' add.py", tags=["python", "debug"]),
    dict(id="med-mkdir-tree", instruction="Create the folders a/b/c and inside c a file leaf.txt containing the word leaf.",
         expect_files={"a/b/c/leaf.txt": "leaf\n"},
         solution="mkdir -p a/b/c && echo leaf > a/b/c/leaf.txt", tags=["files"]),
    dict(id="med-distinct-words", instruction="words.txt has one word per line. Write the number of distinct words to distinct.txt.",
         files={"words.txt": "red\nblue\nred\ngreen\nblue\nred\nwhite\n"}, expect_files={"distinct.txt": "4\n"},
         solution="sort -u words.txt | wc -l | tr -d ' ' > distinct.txt", tags=["shell"]),
    dict(id="med-rename", instruction="Rename old_name.txt to new_name.txt.",
         files={"old_name.txt": "keep me\n"}, expect_files={"new_name.txt": "keep me\n"},
         verifier="[ ! -e old_name.txt ]", solution="mv old_name.txt new_name.txt", tags=["files"]),
    dict(id="med-sum-numbers", instruction="numbers.txt has one integer per line. Write their sum to sum.txt.",
         files={"numbers.txt": "12\n7\n-3\n40\n1\n"}, expect_files={"sum.txt": "57\n"},
         solution="awk '{s+=$1} END {print s}' numbers.txt > sum.txt", tags=["shell", "math"]),
    dict(id="med-replace-word", instruction="Replace every occurrence of the word foo with bar in text.txt (edit the file in place).",
         files={"text.txt": "foo is here\nno match\nfoo and foo again\n"},
         expect_files={"text.txt": "bar is here\nno match\nbar and bar again\n"},
         solution="sed -i 's/foo/bar/g' text.txt", tags=["shell", "sed"]),
    dict(id="med-csv-filter", instruction="people.csv has a header and rows name,age. Write the names of the people "
                                          "older than 30, one per line in file order, to older.txt.",
         files={"people.csv": "name,age\nann,34\nben,22\ncid,31\ndee,30\neve,45\n"},
         expect_files={"older.txt": "ann\ncid\neve\n"},
         solution="awk -F, 'NR>1 && $2>30 {print $1}' people.csv > older.txt", tags=["csv", "shell"]),
    dict(id="med-head-lines", instruction="Write the first 3 lines of poem.txt to first3.txt.",
         files={"poem.txt": "one line\ntwo lines\nthree lines\nfour lines\nfive lines\n"},
         expect_files={"first3.txt": "one line\ntwo lines\nthree lines\n"},
         solution="head -n 3 poem.txt > first3.txt", tags=["shell"]),
]

CALC = py("""
    def add(a, b):
        return a - b


    def mul(a, b):
        return a + b


    def div(a, b):
        return a / b
    """)
ACCESS = "".join(f"10.0.0.{i % 4} GET {p} {s}\n" for i, (p, s) in enumerate(
    [("/", 200), ("/api", 500), ("/api", 200), ("/login", 503), ("/api", 200), ("/", 404), ("/api", 502)]))
FIZZ = "".join(("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i)) + "\n"
               for i in range(1, 16))
HARD = [
    dict(id="hard-fix-calc", instruction="calc.py has bugs: add and mul give wrong results. Fix them; "
                                         "`python3 test_calc.py` must print ok.",
         files={"calc.py": CALC, "test_calc.py": py("""
             from calc import add, mul, div
             assert add(2, 3) == 5
             assert mul(2, 3) == 6
             assert div(6, 3) == 2
             print("ok")
             """)},
         # Partial credit: 0.5 for each function fixed (both of its cases right), and only while div
         # still works, so breaking the module to dodge a case gains nothing.
         verifier_files={".verify/check.py": CALL_HELPER + py("""

             cases = [("div(9, 3)", 3.0), ("add(4, 5)", 9), ("add(-1, 1)", 0), ("mul(4, 5)", 20), ("mul(0, 7)", 0)]
             ok = [got == repr(want) for got, (_, want) in zip(call_all("calc", [e for e, _ in cases]), cases)]
             score = 0.5 * (ok[1] and ok[2]) + 0.5 * (ok[3] and ok[4]) if ok[0] else 0.0
             print(f"score: {score:.3f}")
             """)},
         verifier="python3 -I .verify/check.py",
         solution="sed -i '2s/a - b/a + b/; 6s/a + b/a * b/' calc.py",
         pass_threshold=1.0, tags=["python", "debug"]),
    dict(id="hard-json-merge", instruction="Merge a.json and b.json into merged.json: every key of both, and where "
                                           "both have a key the value from b.json wins.",
         files={"a.json": '{"x": 1, "y": 2, "z": 3}\n', "b.json": '{"y": 20, "w": 40}\n'},
         verifier="python3 -I -c \"import json; d = json.load(open('merged.json')); "
                  "assert d == {'x': 1, 'y': 20, 'z': 3, 'w': 40}, d\"",
         solution="python3 -c \"import json; a = json.load(open('a.json')); a.update(json.load(open('b.json'))); "
                  "json.dump(a, open('merged.json', 'w'))\"", tags=["json", "python"]),
    dict(id="hard-word-freq", instruction="Find the 3 most frequent words in text.txt and write them to top3.txt, "
                                          "one per line as 'word count', most frequent first.",
         files={"text.txt": "the cat and the dog and the bird\nthe end and a cat\n"},
         expect_files={"top3.txt": "the 4\nand 3\ncat 2\n"},
         solution="tr ' ' '\\n' < text.txt | grep -v '^$' | sort | uniq -c | sort -k1,1nr -k2 | head -3 "
                  "| awk '{print $2, $1}' > top3.txt", tags=["shell"]),
    dict(id="hard-palindrome", instruction="Write pal.py defining is_palindrome(s) -> bool that ignores case and "
                                           "every character that is not a letter.",
         # All or nothing: a constant True would pass most of the cases.
         verifier_files={".verify/check.py": CALL_HELPER + py("""

             cases = [("Racecar", True), ("A man, a plan, a canal: Panama", True), ("hello", False),
                      ("", True), ("ab", False), ("No 'x' in Nixon", True), ("abca", False)]
             got = call_all("pal", [f"is_palindrome({s!r}) is True" for s, _ in cases])
             sys.exit(0 if got == [repr(want) for _, want in cases] else 1)
             """)},
         verifier="python3 -I .verify/check.py",
         solution="printf '%s\\n' 'def is_palindrome(s):' '    t = [c.lower() for c in s if c.isalpha()]' "
                  "'    return t == t[::-1]' > pal.py", tags=["python"]),
    dict(id="hard-log-report", instruction="access.log has lines 'IP METHOD PATH STATUS'. Write report.json with "
                                           "keys total (number of lines), errors (lines with status >= 500) and "
                                           "top_path (the most common path).",
         files={"access.log": ACCESS},
         # Partial credit: 1/3 for each key with the right value.
         verifier_files={".verify/check.py": py("""
             import json
             try:
                 d = json.load(open("report.json"))
             except Exception:
                 print("score: 0"); raise SystemExit
             want = {"total": 7, "errors": 3, "top_path": "/api"}
             ok = sum(1 for k, v in want.items() if isinstance(d, dict) and type(d.get(k)) is type(v) and d.get(k) == v)
             print(f"score: {ok / len(want):.3f}")
             """)},
         verifier="python3 -I .verify/check.py",
         solution="python3 -c \"import json, collections; ls = [l.split() for l in open('access.log') if l.strip()]; "
                  "json.dump({'total': len(ls), 'errors': sum(int(l[3]) >= 500 for l in ls), "
                  "'top_path': collections.Counter(l[2] for l in ls).most_common(1)[0][0]}, open('report.json', 'w'))\"",
         tags=["python", "json"]),
    dict(id="hard-count-script", instruction="Write a shell script count.sh that takes a folder as its argument and "
                                             "prints how many .txt files are directly inside it.",
         verifier="mkdir -p .verify/d1 .verify/d2/sub && touch .verify/d1/a.txt .verify/d1/b.txt .verify/d1/c.md "
                  ".verify/d2/sub/x.txt .verify/d2/y.txt && "
                  "[ \"$(sh count.sh .verify/d1 </dev/null 2>/dev/null | tr -d ' ')\" = 2 ] && "
                  "[ \"$(sh count.sh .verify/d2 </dev/null 2>/dev/null | tr -d ' ')\" = 1 ]",
         solution="printf '%s\\n' 'n=0; for f in \"$1\"/*.txt; do [ -f \"$f\" ] && n=$((n+1)); done; echo $n' > count.sh",
         tags=["shell"]),
    dict(id="hard-fizzbuzz", instruction="Write fizzbuzz.py that prints the numbers 1 to 15, one per line, but Fizz "
                                         "for multiples of 3, Buzz for multiples of 5 and FizzBuzz for both.",
         verifier_files={".verify/check.py": KEEP_OUT + py(f"""
             import subprocess
             import sys
             try:
                 done = subprocess.run([sys.executable, "fizzbuzz.py"], capture_output=True, text=True, timeout=40,
                                       stdin=subprocess.DEVNULL)
             except subprocess.TimeoutExpired:
                 sys.exit(1)
             sys.exit(0 if done.returncode == 0 and done.stdout == {FIZZ!r} else 1)
             """)},
         verifier="python3 -I .verify/check.py",
         solution="printf '%s\\n' 'for i in range(1, 16):' "
                  "'    print(\"FizzBuzz\" if i % 15 == 0 else \"Fizz\" if i % 3 == 0 else \"Buzz\" if i % 5 == 0 else i)' "
                  "> fizzbuzz.py", tags=["python"]),
    dict(id="hard-dedupe", instruction="Remove the duplicate lines of list.txt in place, keeping the first "
                                       "occurrence of each line and the original order.",
         files={"list.txt": "b\na\nb\nc\na\nd\n"}, expect_files={"list.txt": "b\na\nc\nd\n"},
         solution="awk '!seen[$0]++' list.txt > list.tmp && mv list.tmp list.txt", tags=["shell"]),
]


def main() -> None:
    for name, tasks, difficulty, limit in (("easy", EASY, "easy", 60), ("medium", MEDIUM, "medium", 120),
                                           ("hard", HARD, "hard", 240)):
        with open(HERE / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for task in tasks:
                f.write(json.dumps({"difficulty": difficulty, "time_limit_s": limit, **task}) + "\n")


if __name__ == "__main__":
    main()
