"""Inference engines behind one protocol, SGLang's native HTTP API.

client.py (EngineClient, used by the proxy and the trainer) · sglang_api.py (the one server app:
routes, shapes, the --api-key check, over a backend protocol) · embedded.py (the CPU engine's
backend: scheduler.py, prefix_cache.py, kv.py, sampling.py, lora.py, weights.py, model.py) ·
scripted.py (scripted completions for tests) · supervisor.py + sglang.py (EngineProcess: launch,
watch, restart) · serve.py (serve_in_thread) · tiny.py (the tiny model). Nothing heavy is imported
here, so `import openforge.engine.client` stays fast.
"""
