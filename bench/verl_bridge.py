"""The online veRL bridge (integrations/verl/agent_loop.py): what running a sample as an OpenForge rollout costs
against veRL's own single-turn agent loop, on the same veRL server.

veRL 0.9.1's real `AgentLoopWorker.generate_sequences` (padding and `_postprocess` included) on a batch of
`easy-sum` rows, two ways, interleaved batch by batch:

    single_turn   veRL's `single_turn_agent`: the chat template, one `generate`   (the baseline)
    openforge     `openforge_agent`: mini in a local sandbox, its calls through the recording proxy and
                  the engine adapter to the same `generate`, the task's grader, the trajectory read back

Both call `EmbeddedVerlServer` (veRL's `LLMServerClient.generate` stand-in) over the embedded engine with
the tiny model, at most 8 new tokens a call, so the engine's own time is small and the figures show the
bridge's cost: sandbox start, the harness process, the proxy hop and recording, grading. Needs veRL 0.9.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def run(quick: bool = False) -> dict:
    import numpy as np
    import verl
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto

    from openforge.engine.embedded import EmbeddedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.engine.tiny import build_tiny_model
    from openforge.config import EmbeddedEngineConfig
    from openforge.rollouts.tasks.format import load_tasks
    from openforge.integrations.verl import agent_loop as bridge
    from openforge.integrations.verl.data import ground_truth

    batch, repeats = (2, 3) if quick else (4, 6)

    class Capped(bridge.EmbeddedVerlServer):
        async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                           **kw: Any) -> Any:
            return await super().generate(request_id, prompt_ids=prompt_ids,
                                          sampling_params={**sampling_params, "max_tokens": 8}, **kw)

    task = next(t for t in load_tasks("builtin") if t.id == "easy-sum")
    spec = task.model_dump(mode="json")

    def rows(agent: str) -> DataProto:
        row = {"data_source": "openforge.integrations.verl.reward", "agent_name": agent, "index": 0,
               "raw_prompt": [{"role": "user", "content": task.instruction}],
               "reward_model": {"style": "rule", "ground_truth": ground_truth(spec)},
               "extra_info": {"index": 0, "task_id": task.id, "task": json.dumps(spec)}}
        return DataProto.from_dict(non_tensors={k: np.array([row[k]] * batch, dtype=object) for k in row})

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = build_tiny_model(tmp / "tiny")
        (tmp / "forge.toml").write_text('[harness]\nname = "mini"\nmax_turns = 2\n[runner]\nconcurrency = 8\n')
        (tmp / "loops.yaml").write_text(f"- name: {bridge.AGENT_NAME}\n  _target_: openforge.integrations.verl.agent_loop.OpenForgeAgentLoop\n"
                                        f"  forge_config: {tmp / 'forge.toml'}\n  forge_home: {tmp / 'home'}\n")
        cfg = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__), "trainer/config/_generated_ppo_trainer.yaml"))
        cfg.actor_rollout_ref.model.path = str(model)
        r = cfg.actor_rollout_ref.rollout
        r.name, r.prompt_length, r.response_length, r.calculate_log_probs = "sglang", 1024, 256, True
        r.agent.agent_loop_config_path = str(tmp / "loops.yaml")
        engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(model), max_batch_size=8))
        times: dict[str, list[float]] = {"single_turn": [], "openforge": []}
        calls: dict[str, int] = {"single_turn": 0, "openforge": 0}
        try:
            with serve_in_thread(engine.app) as eng:
                server = Capped(eng.url, prompt_length=1024, response_length=256)
                worker = AgentLoopWorker(cfg, llm_client=server)

                async def main() -> float:
                    t0 = time.perf_counter()
                    await worker.generate_sequences(rows(bridge.AGENT_NAME))  # starts the bridge (and warms up)
                    start_s = time.perf_counter() - t0
                    await worker.generate_sequences(rows("single_turn_agent"))
                    for _ in range(repeats):
                        for name, agent in (("single_turn", "single_turn_agent"), ("openforge", bridge.AGENT_NAME)):
                            before = len(server.calls)
                            t = time.perf_counter()
                            out = await worker.generate_sequences(rows(agent))
                            times[name].append((time.perf_counter() - t) * 1000 / batch)
                            calls[name] += len(server.calls) - before
                            assert out.batch["responses"].shape[0] == batch
                    await server.aclose()
                    bridge.close_bridges()
                    return start_s

                first_batch_s = asyncio.run(main())
        finally:
            engine.close()
    per = {k: round(statistics.median(v), 1) for k, v in times.items()}
    res = {
        "batch": batch, "repeats": repeats,
        "single_turn_ms_per_sample": per["single_turn"], "openforge_ms_per_sample": per["openforge"],
        "ratio_openforge_vs_single_turn": round(per["openforge"] / per["single_turn"], 2),
        "calls_per_sample": {k: round(v / (batch * repeats), 2) for k, v in calls.items()},
        "first_openforge_batch_s (bridge start)": round(first_batch_s, 2),
    }
    print(f"veRL bridge, {batch} samples a batch, median of {repeats}: veRL single-turn {per['single_turn']} ms/sample, "
          f"openforge_agent {per['openforge']} ms/sample ({res['ratio_openforge_vs_single_turn']}x); "
          f"engine calls/sample {res['calls_per_sample']}; first openforge batch (bridge start) {first_batch_s:.1f} s")
    return res
