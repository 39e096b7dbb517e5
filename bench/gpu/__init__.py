"""The GPU check (issue 48): one prepared run on one GPU, and its CPU dry run that CI runs.

    run.sh       the entry: carried wheels, the openforge namespace without an install, then main.py
    prepare.sh   downloads the wheels the device lacks into .whl/ (the `run` call's carry)
    wheels.txt   those wheels, pinned
    main.py      the parts in order, one JSON and one markdown table
    models.py    Qwen3-1.7B- and Qwen2.5-7B-shaped checkpoints with random weights, built locally
    serving.py   engine decode vs model.generate, the prefix cache, the GRPO batch, LoRA hot-load
    training.py  forge's GRPO step, TRL's GRPOTrainer, forge's step under torchrun/FSDP2 (child processes)
    report.py    the markdown table
"""
