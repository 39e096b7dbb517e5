"""The GRPO trainer: sample -> train -> save -> hot-load -> record (docs/trainer.md).

    loop.py         train(...): the loop, one readable function; TaskStream
    grpo.py         the math: advantages, the clipped policy loss, one optimizer step
    off_policy.py   the engine/trainer gap per token: TIS, MIS, IcePop weights; the step's mismatch
    data.py         Trajectory + Rollout rows -> Samples with advantages -> padded micro-batches
    prefix.py       shared-prefix training with exact gradients
    vision.py       a trajectory's images as the model's pixel inputs
    model.py        the policy (HF causal LM + PEFT LoRA), optimizer, LR schedule, device
    distributed.py  data-parallel steps under torchrun (FSDP2)
    launch.py       starting the trainer under torchrun
    checkpoint.py   atomic checkpoints and resume
    samplers.py     the Sampler interface; RolloutSampler (real harnesses), EngineSampler (engine only)
    buffer.py       GroupBuffer: asynchronous sampling with bounded staleness (trainer.max_staleness)
    adapter_sync.py AdapterSync: each saved adapter into the engine
    bridge.py       BackgroundLoop: the async engine client from the synchronous loop
    cancel.py       CancelToken: stop sampling from another thread
    export.py       forge export: veRL parquet and JSONL
    model_export.py forge export --format peft|merged: the adapter folder, or the merged weights
    sft.py          forge sft: supervised fine-tuning on the kept rollouts of earlier runs
    packing.py      SFT sequences packed into rows, attention kept within each sequence
    warmup/         the demo warm-ups
"""
