"""The recording proxy: OpenAI Chat / Responses and Anthropic Messages in, SGLang token ids out,
every call recorded (see docs/proxy.md). Entry points: `proxy.server.ProxyServer`,
`proxy.app.create_app`; the recorded calls become training sequences in `rollouts.trajectory`."""
