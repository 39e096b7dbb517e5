"""Writes easy.jsonl, medium.jsonl and hard.jsonl: the built-in task set (`--tasks builtin`).

The JSONL files are what forge reads; this script is their source, because shell verifiers are far
easier to read here than JSON-escaped. Edit, then run `python rollouts/builtin_tasks/generate.py`.
Every task carries a reference `solution`; tests/test_tasks_builtin.py proves each one passes with
it and does not pass without it.

Easy tasks grade the agent's final answer (the mini harness writes it to .forge/answer.txt) with a
partial score: 0.2 for any non-empty answer plus 0.8 x the fraction of target words it contains. A
random-weight model therefore still gets varied rewards, which GRPO needs within a group.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

HERE = Path(__file__).parent
ANSWER = ".forge/answer.txt"


def words_verifier(*words: str) -> str:
    """score = 0.2 * (answer non-empty) + 0.8 * (target words found) / (target words)."""
    return (
        f"a=$(tr 'A-Z' 'a-z' < {ANSWER} 2>/dev/null); n=0; h=0; "
        f"for w in {' '.join(words)}; do n=$((n+1)); case \"$a\" in *\"$w\"*) h=$((h+1));; esac; done; "
        "e=0; [ -n \"$(printf '%s' \"$a\" | tr -d ' \\t\\n')\" ] && e=1; "
        "awk -v h=$h -v n=$n -v e=$e 'BEGIN{printf \"score: %.3f\\n\", 0.2*e + 0.8*h/n}'"
    )


def answer(text: str) -> str:
    return f"mkdir -p .forge && printf '%s\\n' '{text}' > {ANSWER}"


def checks_verifier(*checks: str) -> str:
    """score = the fraction of shell checks that succeed (each check is one `test`-like command)."""
    body = " ".join(f"if {c}; then h=$((h+1)); fi;" for c in checks)
    return f"h=0; {body} awk -v h=$h -v n={len(checks)} 'BEGIN{{printf \"score: %.3f\\n\", h/n}}'"


def py(code: str) -> str:
    return textwrap.dedent(code).lstrip()


EASY = [
    dict(id="easy-say-hello", instruction="Answer with the two words: hello world",
         verifier=words_verifier("hello", "world"), solution=answer("hello world"), tags=["answer"]),
    dict(id="easy-say-done", instruction="Do nothing else; just answer with the single word: done",
         verifier=words_verifier("done"), solution=answer("done"), tags=["answer"]),
    dict(id="easy-true-false", instruction="Is 7 greater than 3? Answer true or false.",
         verifier=words_verifier("true"), solution=answer("true"), tags=["answer"]),
    dict(id="easy-yes-no", instruction="Does the file data.txt exist in your working directory? Answer yes or no.",
         files={"data.txt": "some data\n"}, verifier=words_verifier("yes"), solution=answer("yes"),
         tags=["answer", "files"]),
    dict(id="easy-sum", instruction="What is 2 + 3? Answer with the number.",
         verifier=words_verifier("5"), solution=answer("5"), tags=["answer", "math"]),
    dict(id="easy-read-word", instruction="Read word.txt and answer with the word it contains.",
         files={"word.txt": "json\n"}, verifier=words_verifier("json"), solution=answer("json"),
         tags=["answer", "files"]),
    dict(id="easy-count-words", instruction="How many words are in the text 'the quick brown fox'? Answer with a number.",
         verifier=words_verifier("4"), solution=answer("4"), tags=["answer", "math"]),
    dict(id="easy-list-tools", instruction="Which tools do you have? Answer with their names: bash, read_file, write_file.",
         verifier=words_verifier("bash", "read_file", "write_file"), solution=answer("bash read_file write_file"),
         tags=["answer"]),
    dict(id="easy-status-ok", instruction="Report your status: answer with the words status ok",
         verifier=words_verifier("status", "ok"), solution=answer("status ok"), tags=["answer"]),
    dict(id="easy-write-ok", instruction="Create a file named ok.txt whose content is the word ok.",
         verifier=checks_verifier("[ -f ok.txt ]", "[ \"$(cat ok.txt 2>/dev/null)\" = ok ]"),
         solution="printf 'ok\\n' > ok.txt", tags=["files"]),
]

LOG = "INFO start\nERROR disk full\nINFO retry\nERROR disk full\nWARN slow\nERROR timeout\nINFO done\nERROR bad input\n"
NAMES = "mallory\nalice\ntrent\nbob\ncarol\n"
MEDIUM = [
    dict(id="med-create-file", instruction="Create a file hello.txt containing exactly the line: hello world",
         verifier="[ \"$(cat hello.txt)\" = 'hello world' ]", solution="echo 'hello world' > hello.txt",
         tags=["files"]),
    dict(id="med-count-errors", instruction="Count the lines of log.txt that contain ERROR and write the number to count.txt.",
         files={"log.txt": LOG}, verifier="[ \"$(tr -d ' \\n' < count.txt)\" = 4 ]",
         solution="grep -c ERROR log.txt > count.txt", tags=["shell", "grep"]),
    dict(id="med-sort-names", instruction="Write the lines of names.txt in alphabetical order to sorted.txt.",
         files={"names.txt": NAMES}, verifier_files={".verify/sorted.txt": "alice\nbob\ncarol\nmallory\ntrent\n"},
         verifier="cmp -s sorted.txt .verify/sorted.txt", solution="sort names.txt > sorted.txt", tags=["shell"]),
    dict(id="med-edit-json", instruction="In config.json set \"port\" to 9090 and leave every other key as it is.",
         files={"config.json": json.dumps({"name": "app", "port": 8080, "debug": True}, indent=2) + "\n"},
         verifier="python3 -c \"import json; d = json.load(open('config.json')); "
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
         verifier="[ \"$(python3 add.py 2 3)\" = 5 ] && [ \"$(python3 add.py 10 7)\" = 17 ]",
         solution="sed -i 's/a - b/a + b/' add.py", tags=["python", "debug"]),
    dict(id="med-mkdir-tree", instruction="Create the folders a/b/c and inside c a file leaf.txt containing the word leaf.",
         verifier=checks_verifier("[ -d a/b/c ]", "[ \"$(cat a/b/c/leaf.txt 2>/dev/null)\" = leaf ]"),
         solution="mkdir -p a/b/c && echo leaf > a/b/c/leaf.txt", tags=["files"]),
    dict(id="med-distinct-words", instruction="words.txt has one word per line. Write the number of distinct words to distinct.txt.",
         files={"words.txt": "red\nblue\nred\ngreen\nblue\nred\nwhite\n"},
         verifier="[ \"$(tr -d ' \\n' < distinct.txt)\" = 4 ]", solution="sort -u words.txt | wc -l > distinct.txt",
         tags=["shell"]),
    dict(id="med-rename", instruction="Rename old_name.txt to new_name.txt.",
         files={"old_name.txt": "keep me\n"},
         verifier=checks_verifier("[ \"$(cat new_name.txt 2>/dev/null)\" = 'keep me' ]", "[ ! -e old_name.txt ]"),
         solution="mv old_name.txt new_name.txt", tags=["files"]),
    dict(id="med-sum-numbers", instruction="numbers.txt has one integer per line. Write their sum to sum.txt.",
         files={"numbers.txt": "12\n7\n-3\n40\n1\n"}, verifier="[ \"$(tr -d ' \\n' < sum.txt)\" = 57 ]",
         solution="awk '{s+=$1} END {print s}' numbers.txt > sum.txt", tags=["shell", "math"]),
    dict(id="med-replace-word", instruction="Replace every occurrence of the word foo with bar in text.txt (edit the file in place).",
         files={"text.txt": "foo is here\nno match\nfoo and foo again\n"},
         verifier_files={".verify/text.txt": "bar is here\nno match\nbar and bar again\n"},
         verifier="cmp -s text.txt .verify/text.txt", solution="sed -i 's/foo/bar/g' text.txt", tags=["shell", "sed"]),
    dict(id="med-csv-filter", instruction="people.csv has a header and rows name,age. Write the names of the people "
                                          "older than 30, one per line in file order, to older.txt.",
         files={"people.csv": "name,age\nann,34\nben,22\ncid,31\ndee,30\neve,45\n"},
         verifier_files={".verify/older.txt": "ann\ncid\neve\n"}, verifier="cmp -s older.txt .verify/older.txt",
         solution="awk -F, 'NR>1 && $2>30 {print $1}' people.csv > older.txt", tags=["csv", "shell"]),
    dict(id="med-head-lines", instruction="Write the first 3 lines of poem.txt to first3.txt.",
         files={"poem.txt": "one line\ntwo lines\nthree lines\nfour lines\nfive lines\n"},
         verifier_files={".verify/first3.txt": "one line\ntwo lines\nthree lines\n"},
         verifier="cmp -s first3.txt .verify/first3.txt", solution="head -n 3 poem.txt > first3.txt", tags=["shell"]),
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
         verifier_files={".verify/check.py": py("""
             import sys
             sys.path.insert(0, ".")
             from calc import add, mul, div
             cases = [(add, (4, 5), 9), (add, (-1, 1), 0), (mul, (4, 5), 20), (mul, (0, 7), 0), (div, (9, 3), 3)]
             ok = sum(1 for f, args, want in cases if f(*args) == want)
             print(f"score: {ok / len(cases):.3f}")
             """)},
         verifier="python3 .verify/check.py || echo 'score: 0'",
         solution="sed -i '2s/a - b/a + b/; 6s/a + b/a * b/' calc.py",
         pass_threshold=1.0, tags=["python", "debug"]),
    dict(id="hard-json-merge", instruction="Merge a.json and b.json into merged.json: every key of both, and where "
                                           "both have a key the value from b.json wins.",
         files={"a.json": '{"x": 1, "y": 2, "z": 3}\n', "b.json": '{"y": 20, "w": 40}\n'},
         verifier="python3 -c \"import json; d = json.load(open('merged.json')); "
                  "assert d == {'x': 1, 'y': 20, 'z': 3, 'w': 40}, d\"",
         solution="python3 -c \"import json; a = json.load(open('a.json')); a.update(json.load(open('b.json'))); "
                  "json.dump(a, open('merged.json', 'w'))\"", tags=["json", "python"]),
    dict(id="hard-word-freq", instruction="Find the 3 most frequent words in text.txt and write them to top3.txt, "
                                          "one per line as 'word count', most frequent first.",
         files={"text.txt": "the cat and the dog and the bird\nthe end and a cat\n"},
         verifier_files={".verify/top3.txt": "the 4\nand 3\ncat 2\n"},
         verifier="cmp -s top3.txt .verify/top3.txt",
         solution="tr ' ' '\\n' < text.txt | grep -v '^$' | sort | uniq -c | sort -k1,1nr -k2 | head -3 "
                  "| awk '{print $2, $1}' > top3.txt", tags=["shell"]),
    dict(id="hard-palindrome", instruction="Write pal.py defining is_palindrome(s) -> bool that ignores case and "
                                           "every character that is not a letter.",
         verifier_files={".verify/check.py": py("""
             import sys
             sys.path.insert(0, ".")
             try:
                 from pal import is_palindrome
             except Exception:
                 print("score: 0"); raise SystemExit
             cases = [("Racecar", True), ("A man, a plan, a canal: Panama", True), ("hello", False),
                      ("", True), ("ab", False), ("No 'x' in Nixon", True)]
             ok = 0
             for s, want in cases:
                 try:
                     ok += is_palindrome(s) is want
                 except Exception:
                     pass
             print(f"score: {ok / len(cases):.3f}")
             """)},
         verifier="python3 .verify/check.py",
         solution="printf '%s\\n' 'def is_palindrome(s):' '    t = [c.lower() for c in s if c.isalpha()]' "
                  "'    return t == t[::-1]' > pal.py", tags=["python"]),
    dict(id="hard-log-report", instruction="access.log has lines 'IP METHOD PATH STATUS'. Write report.json with "
                                           "keys total (number of lines), errors (lines with status >= 500) and "
                                           "top_path (the most common path).",
         files={"access.log": ACCESS},
         verifier_files={".verify/check.py": py("""
             import json
             try:
                 d = json.load(open("report.json"))
             except Exception:
                 print("score: 0"); raise SystemExit
             want = {"total": 7, "errors": 3, "top_path": "/api"}
             ok = sum(1 for k, v in want.items() if isinstance(d, dict) and d.get(k) == v)
             print(f"score: {ok / len(want):.3f}")
             """)},
         verifier="python3 .verify/check.py",
         solution="python3 -c \"import json, collections; ls = [l.split() for l in open('access.log') if l.strip()]; "
                  "json.dump({'total': len(ls), 'errors': sum(int(l[3]) >= 500 for l in ls), "
                  "'top_path': collections.Counter(l[2] for l in ls).most_common(1)[0][0]}, open('report.json', 'w'))\"",
         tags=["python", "json"]),
    dict(id="hard-count-script", instruction="Write a shell script count.sh that takes a folder as its argument and "
                                             "prints how many .txt files are directly inside it.",
         verifier="mkdir -p .verify/d1 .verify/d2/sub && touch .verify/d1/a.txt .verify/d1/b.txt .verify/d1/c.md "
                  ".verify/d2/sub/x.txt && "
                  + checks_verifier("[ \"$(sh count.sh .verify/d1 2>/dev/null | tr -d ' ')\" = 2 ]",
                                    "[ \"$(sh count.sh .verify/d2 2>/dev/null | tr -d ' ')\" = 0 ]"),
         solution="printf '%s\\n' 'n=0; for f in \"$1\"/*.txt; do [ -f \"$f\" ] && n=$((n+1)); done; echo $n' > count.sh",
         tags=["shell"]),
    dict(id="hard-fizzbuzz", instruction="Write fizzbuzz.py that prints the numbers 1 to 15, one per line, but Fizz "
                                         "for multiples of 3, Buzz for multiples of 5 and FizzBuzz for both.",
         verifier_files={".verify/want.txt": "".join(
             ("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i)) + "\n"
             for i in range(1, 16))},
         verifier="python3 fizzbuzz.py > .verify/got.txt 2>/dev/null; "
                  "awk 'NR==FNR {w[FNR]=$0; next} FNR in w && w[FNR]==$0 {h++} "
                  "END {printf \"score: %.3f\\n\", h/15}' .verify/want.txt .verify/got.txt",
         solution="printf '%s\\n' 'for i in range(1, 16):' "
                  "'    print(\"FizzBuzz\" if i % 15 == 0 else \"Fizz\" if i % 3 == 0 else \"Buzz\" if i % 5 == 0 else i)' "
                  "> fizzbuzz.py", tags=["python"]),
    dict(id="hard-dedupe", instruction="Remove the duplicate lines of list.txt in place, keeping the first "
                                       "occurrence of each line and the original order.",
         files={"list.txt": "b\na\nb\nc\na\nd\n"}, verifier_files={".verify/list.txt": "b\na\nc\nd\n"},
         verifier="cmp -s list.txt .verify/list.txt",
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
