"""Short supervised warm-ups for the demo's tiny random models: they teach the *format* of an answer
(a number for the text demo, an action for mini-gui), never the answer, so GRPO has something to
reinforce. Demo support only; user models start from their own checkpoint.

    text.py   the `mini` harness's number answers
    gui.py    the tiny VLM's mini-gui actions
"""
