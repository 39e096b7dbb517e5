"""veRL's side of the agent-loop tests: its AgentLoopWorker on the tiny model, batches of its shape, and their
outputs unpadded. Importing it skips the importing module where veRL is not importable (fails under
FORGE_REQUIRE=verl)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from tests.helpers.required import skip_or_fail

try:
    import verl.experimental.agent_loop.agent_loop  # noqa: F401
except ImportError as exc:
    skip_or_fail("verl", f"veRL 0.9.1 (with hydra-core) not installed ({exc})")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.protocol import DataProto  # noqa: E402

from openforge.integrations.verl import agent_loop as bridge_mod  # noqa: E402
from openforge.integrations.verl.agent_loop import AGENT_NAME, EmbeddedVerlServer  # noqa: E402
from openforge.integrations.verl.data import ground_truth  # noqa: E402
from openforge.rollouts.tasks.format import load_tasks  # noqa: E402

PROMPT_LEN, RESPONSE_LEN = 1024, 512


def worker_for(model: Path, tmp: Path, server: Any, *, temperature: float = 0.7, forge_toml: str = "") -> AgentLoopWorker:
    """veRL's own AgentLoopWorker, its agent loop read from an agent-loop YAML (veRL's registry path)."""
    import verl

    (tmp / "forge.toml").write_text(forge_toml or '[harness]\nname = "mini"\nmax_turns = 4\n')
    (tmp / "agent_loops.yaml").write_text(
        f"- name: {AGENT_NAME}\n  _target_: openforge.integrations.verl.agent_loop.OpenForgeAgentLoop\n"
        f"  forge_config: {tmp / 'forge.toml'}\n  forge_home: {tmp / 'home'}\n")
    cfg = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__), "trainer/config/_generated_ppo_trainer.yaml"))
    cfg.actor_rollout_ref.model.path = str(model)
    rollout = cfg.actor_rollout_ref.rollout
    rollout.name, rollout.prompt_length, rollout.response_length = "sglang", PROMPT_LEN, RESPONSE_LEN
    rollout.temperature, rollout.calculate_log_probs = temperature, True
    rollout.agent.agent_loop_config_path = str(tmp / "agent_loops.yaml")
    return AgentLoopWorker(cfg, llm_client=server)


def batch_of(task_ids: list[str], task_set: str = "builtin") -> DataProto:
    tasks = {t.id: t for t in load_tasks(task_set)}
    rows = []
    for i, tid in enumerate(task_ids):
        spec = tasks[tid].model_dump(mode="json")
        rows.append({"data_source": "openforge.integrations.verl.reward", "agent_name": AGENT_NAME, "index": i,
                     "raw_prompt": [{"role": "user", "content": tasks[tid].instruction}],
                     "reward_model": {"style": "rule", "ground_truth": ground_truth(spec)},
                     "extra_info": {"index": i, "task_id": tid, "task": json.dumps(spec)}})
    non_tensor = {k: np.array([r[k] for r in rows], dtype=object) for k in rows[0]}
    return DataProto.from_dict(non_tensors=non_tensor)


def generate(worker: AgentLoopWorker, batch: DataProto, server: EmbeddedVerlServer) -> DataProto:
    async def main() -> DataProto:
        try:
            return await worker.generate_sequences(batch)
        finally:
            await server.aclose()
            bridge_mod.close_bridges()

    return asyncio.run(main())


def unpad(out: DataProto, i: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt, response, response mask, rollout log probs) of sample i without veRL's padding."""
    b = out.batch
    prompt_valid = b["attention_mask"][i, :PROMPT_LEN].bool()
    resp_valid = b["attention_mask"][i, PROMPT_LEN:].bool()
    n = int(resp_valid.sum())
    assert resp_valid[:n].all(), "veRL right-pads responses"
    return (b["prompts"][i][prompt_valid].tolist(), b["responses"][i, :n].tolist(),
            b["response_mask"][i, :n].tolist(), b["rollout_log_probs"][i, :n].tolist())


def runs_of(mask: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for j, m in enumerate([*mask, 0]):
        if m and start is None:
            start = j
        elif not m and start is not None:
            spans.append((start, j))
            start = None
    return spans
