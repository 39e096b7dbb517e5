"""The recording proxy: OpenAI Chat / Responses and Anthropic Messages in, SGLang token ids out,
every call recorded (see docs/proxy.md); or, with `engine.kind = "remote"`, a teacher's endpoint out
(`teacher.py`), its answers recorded in the student's tokens; and a task's judge on the run's engine with
its base weights (`judge.py`, `judge.endpoint = "policy-base"`), recorded as judgements. Entry points: `openforge.proxy.server.ProxyServer`,
`openforge.proxy.app.create_app`; the recorded calls become training sequences in `openforge.rollouts.runner.trajectory`."""
