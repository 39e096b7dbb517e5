"""The veRL bridge: veRL trains, forge runs the harness rollouts and grades them.

    agent_loop.py   OpenForgeAgentLoop: veRL's agent loop that runs a task through a real harness behind
                    forge's proxy and hands veRL the recorded token ids, masks and logprobs
    data.py         `forge export --format verl-sft|verl-rl`: rows veRL's datasets read
    sft.py          ForgeSFTDataset, veRL's multi-turn SFT dataset over those rows
    reward.py       compute_score for the RL rows (exact, the same grading as forge's runner)

veRL's YAML names `openforge.integrations.verl.agent_loop.OpenForgeAgentLoop`; see docs/trainer.md.
"""
