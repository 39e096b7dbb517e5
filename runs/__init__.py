"""One run's lifecycle, below the CLI and above the trainer, the rollouts, the proxy and the engine.

- `session.run_session`: one `forge up` / `forge train` session (torchrun relaunch, dead runs, preflight,
  the run row, the front end, the summary), the same for both.
- `stack.Stack`: engine + proxy (+ runner, + the trainer's engine client), up and down as one.
- `control.RunController`: pause / resume / stop from any thread, through the sampler's cancel token;
  `control.stop_run`: `forge stop` from another process.
- `prepare`: preflight (what this machine lacks, refused with the fix; the run's isolation), the model,
  the run row; `checks`: the machine checks `forge doctor` prints.
- `train.run_training`, `evaluate.evaluate`, `proxy_session.ProxySession`: the three kinds of run, each
  ending finished, stopped, or failed with the reason; `sft.run_sft`: `forge sft`, a run of kind sft;
  `collect.collect`: `forge collect`, a teacher's rollouts counted against a reward threshold (kind collect).
- `model_export.export_model`: `forge export --format peft|merged`, a run's checkpoint as a model folder.
- `tracking`: `[tracking]`, each train step logged to W&B / TensorBoard / MLflow (`open_tracker`, from `run_training`);
  `plan.plan_run`: `forge up --dry-run`, the plan and every check, nothing started.

Only `forge_cli` imports this package.
"""
