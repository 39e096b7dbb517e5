"""The three stages on the demo tasks: base -> SFT -> SFT+RL, against RL from the base for as many steps.

A scripted teacher (engine/scripted.py, serving SGLang's API as `engine.kind = "url"`) reads the line of
digits in each demo question and answers it; `forge collect` records it driving the real mini harness in
local sandboxes, graded exactly; `forge sft` trains the tiny student (warmed up as `forge up --demo` warms
it) on the kept rollouts; `forge train --init-from` runs GRPO from the SFT adapter and `forge train` from
the base, both with the demo's settings (openforge/presets/demo.toml) for the same number of steps (at
once, each in its own copy of FORGE_HOME). Each
run's first step samples its starting policy before any update, so the base and SFT pass rates are
those steps' rewards. Figures: mean reward (= pass rate) per step of both RL runs, and the blind ceiling
1/k (k tasks whose answers differ). `python -m bench sft_stages`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from statistics import mean
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FORGE = [sys.executable, "-m", "openforge.forge_cli.main"]
QUESTION = re.compile(r"Which digit fills the line '(\d)")
TEACHER_KEY = "teacher-engine-key"
ENGINE = ["--set", "engine.kind=embedded", "--set", "engine.max_batch_size=8"]  # the demo's [engine]


def answer_the_line(tokenizer: Any) -> Any:
    """The teacher's script: the digit that fills the last demo question's line (prompt ids -> text)."""
    def answer(prompt_ids: list[int]) -> str:
        found = QUESTION.findall(tokenizer.decode(prompt_ids))
        return found[-1] if found else "I do not know."
    return answer


@contextmanager
def scripted_teacher(student: Path) -> Iterator[str]:
    """A scripted engine that solves the demo tasks, on loopback; yields its URL."""
    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread

    engine = ScriptedEngine(student, lambda ids: "", model_name="teacher", api_key=TEACHER_KEY)
    engine.script = answer_the_line(engine.tokenizer)
    server = serve_in_thread(engine.app)
    try:
        yield server.url
    finally:
        server.stop()


def demo_home(home: Path) -> Path:
    """`home` with the demo's settings as its ./forge.toml and the tiny student built and warmed up;
    returns the student's folder."""
    from openforge.config import load_config
    from openforge.runs.prepare import resolve_model

    home.mkdir(parents=True, exist_ok=True)
    # The demo's [engine] table is the embedded engine's; the teacher is another kind, so the table's
    # settings travel as --set items of the RL runs (ENGINE) instead.
    preset = (REPO / "openforge" / "presets" / "demo.toml").read_text()
    table = "[engine]\nkind = \"embedded\"\nmax_batch_size = 8\n"
    if table not in preset:
        raise RuntimeError("openforge/presets/demo.toml's [engine] table changed: update bench/sft_stages.py")
    (home / "forge.toml").write_text(preset.replace(table, ""))
    return resolve_model(load_config(home / "forge.toml"), home)


def forge(home: Path, *args: str, timeout: float = 900) -> str:
    """One `forge` command as a user runs it in `home` (its forge.toml); its output, or RuntimeError."""
    out = subprocess.run([*FORGE, *args], env={**os.environ, "FORGE_HOME": str(home)}, cwd=home,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"forge {' '.join(args)} exited {out.returncode}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return out.stdout


def latest_run(home: Path, kind: str) -> Any:
    from openforge.store import Store

    return next(r for r in Store(home / "forge.db").list_runs() if r.kind == kind)


def rewards(home: Path, run_id: str) -> dict[str, Any]:
    """Mean reward per step, overall and per task, of a train run (every rollout graded 0 or 1)."""
    from openforge.store import Store

    rollouts = Store(home / "forge.db").list_rollouts(run_id)
    bad = [(r.status, r.error) for r in rollouts if r.status != "scored"]
    if bad:
        raise RuntimeError(f"run {run_id}: rollouts not graded: {bad[:5]}")
    steps = sorted({r.step for r in rollouts})
    tasks = sorted({r.task_id for r in rollouts})
    return {"per_step": [round(mean(r.reward for r in rollouts if r.step == s), 3) for s in steps],
            "per_task": {t: [round(mean(r.reward for r in rollouts if r.step == s and r.task_id == t), 3)
                             for s in steps] for t in tasks}}


def collect_and_sft(home: Path, *, samples: int, epochs: int) -> dict[str, Any]:
    """`forge collect` with the scripted teacher, then `forge sft` on what passed; ids and counts."""
    student = demo_home(home)
    started = time.perf_counter()
    with scripted_teacher(student) as url:
        forge(home, "--set", "engine.kind=url", "--set", f"engine.url={url}", "--set", f"engine.api_key={TEACHER_KEY}",
              "--set", f"engine.model={student}", "collect", "--samples", str(samples))
    collected = latest_run(home, "collect")
    t_collect = time.perf_counter() - started
    started = time.perf_counter()
    forge(home, "--set", "trainer.device=cpu", "sft", "--from", collected.id, "--epochs", str(epochs), "--val-tasks", "0")
    sft = latest_run(home, "sft")
    return {"collect_run": collected.id, "kept": collected.summary_json["kept"],
            "collected": collected.summary_json["rollouts"], "sft_run": sft.id, "sft_steps": sft.summary_json["steps"],
            "sft_loss_first": round(sft.summary_json["train_loss_first"], 4),
            "sft_loss_last": round(sft.summary_json["train_loss_last"], 4),
            "t_collect_s": round(t_collect, 1), "t_sft_s": round(time.perf_counter() - started, 1)}


def rl(home: Path, steps: int, *, init_from: str | None, sets: Sequence[str] = ()) -> dict[str, Any]:
    """`forge train` with the demo's settings (and `sets`, `--set` items) for `steps` steps, from
    `init_from`'s adapter if given."""
    started = time.perf_counter()
    args = [*ENGINE, *(a for item in sets for a in ("--set", item)), "--set", "trainer.device=cpu", "train",
            "--steps", str(steps)]
    forge(home, *args, *(["--init-from", init_from] if init_from else []), timeout=3600)
    run = latest_run(home, "train")
    return {"run": run.id, **rewards(home, run.id), "t_s": round(time.perf_counter() - started, 1)}


def run(quick: bool = False) -> dict[str, Any]:
    steps = 2 if quick else 6
    with tempfile.TemporaryDirectory(prefix="forge-sft-stages-") as tmp:
        home = Path(tmp) / "home"
        # A short SFT (8 optimizer steps on 8 kept rollouts), so that RL has something left to add.
        data = collect_and_sft(home, samples=4, epochs=4)
        # The two RL runs at once, each in its own copy of the home (same student, same store so far).
        shutil.copytree(home, Path(tmp) / "base")
        with ThreadPoolExecutor(2) as pool:
            sft_job = pool.submit(rl, home, steps, init_from=data["sft_run"])
            base_job = pool.submit(rl, Path(tmp) / "base", steps, init_from=None)
            from_sft, from_base = sft_job.result(), base_job.result()
    blind = 1 / len(from_base["per_task"])
    last = min(3, steps)
    out = {
        "blind_ceiling": blind, **{k: v for k, v in data.items() if not k.endswith("_run")},
        "stages": {"base": from_base["per_step"][0], "sft": from_sft["per_step"][0],
                   "sft_rl_last3": round(mean(from_sft["per_step"][-last:]), 3),
                   "rl_from_base_last3": round(mean(from_base["per_step"][-last:]), 3)},
        "curves": [{"run": "RL from SFT", **_curve(from_sft)}, {"run": "RL from base", **_curve(from_base)}],
        "t_rl_from_sft_s": from_sft["t_s"], "t_rl_from_base_s": from_base["t_s"],
    }
    print(f"blind {blind:.2f}; base {out['stages']['base']:.2f} -> SFT {out['stages']['sft']:.2f} -> "
          f"SFT+RL (last {last}) {out['stages']['sft_rl_last3']:.2f}; RL from base (last {last}) "
          f"{out['stages']['rl_from_base_last3']:.2f}")
    for curve in out["curves"]:
        print(f"  {curve}")
    return out


def _curve(result: dict[str, Any]) -> dict[str, str]:
    row = {"reward per step": " ".join(f"{r:.2f}" for r in result["per_step"])}
    for task, values in result["per_task"].items():
        row[task] = " ".join(f"{r:.2f}" for r in values)
    return row


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
