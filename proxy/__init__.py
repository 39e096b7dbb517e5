"""The recording proxy: OpenAI Chat / Responses and Anthropic Messages in, SGLang token ids out,
every call recorded (see docs/proxy.md); or, with `engine.kind = "remote"`, a teacher's endpoint out
(`teacher.py`), its answers recorded in the student's tokens. Entry points: `openforge.proxy.server.ProxyServer`,
`openforge.proxy.app.create_app`; the recorded calls become training sequences in `openforge.rollouts.runner.trajectory`."""
