"""The recording proxy: OpenAI Chat / Responses and Anthropic Messages in, SGLang token ids out,
every call recorded (see docs/proxy.md). Entry points: `openforge.proxy.server.ProxyServer`,
`openforge.proxy.app.create_app`; the recorded calls become training sequences in `openforge.rollouts.runner.trajectory`."""
