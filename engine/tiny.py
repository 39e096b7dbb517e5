"""Build a tiny, real-architecture causal LM offline: `forge model tiny PATH`.

A Qwen2 model (random weights, ~0.2M parameters, 131,072 positions by default) with a byte-level BPE tokenizer trained here with
`tokenizers` on bundled text, and Qwen2.5's chat template (ChatML with `<tool_call>` tools). It is
saved with `save_pretrained`, so everything that loads it is the same code that loads a real
Qwen2.5/Qwen3 checkpoint directory. Same seed, same files.
"""

from __future__ import annotations

import json
from pathlib import Path

# Qwen2.5's chat template (tools in <tools>, calls in <tool_call>, results in <tool_response>),
# with a neutral default system prompt.
CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

def _template_file(name: str) -> str:
    return (Path(__file__).parent / "templates" / name).read_text(encoding="utf-8")


# `--template`: the chat template the tiny model carries. "tiny" is the default above; the others are
# the real templates of those model families (engine/templates/NOTICE.md: their source and licence).
TEMPLATES = {"tiny": lambda: CHAT_TEMPLATE, "qwen2.5": lambda: _template_file("qwen2.5.jinja"),
             "qwen3": lambda: _template_file("qwen3.jinja"), "qwen3-coder": lambda: _template_file("qwen3-coder.jinja")}
# Qwen3's vocabulary has the thinking tags as added tokens (one token each, sampled like any other).
THINK_TOKENS = ["<think>", "</think>"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2.5 has these as added (non-special) tokens, so they survive decoding with skip_special_tokens.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

_WORDS = (
    "the a an and or of to in on for with file files line lines count create write read fix edit "
    "run test tests script python bash shell command output input json key value list number name "
    "answer done error ok true false hello world data result task please make sure contains word "
    "directory folder path print echo cat grep wc sed sort uniq head tail ls mkdir touch rm cp mv "
    "def return import if else elif for while class self none yes no config version status report "
    "user assistant system tool tools function call arguments content role message messages"
).split()


def text_corpus() -> list[str]:
    """Bundled training text for the tokenizer: words, shell, JSON, and rendered chat turns."""
    lines = [" ".join(_WORDS[i:i + 12]) for i in range(0, len(_WORDS), 12)]
    lines += [f"echo {w} > {w}.txt && cat {w}.txt | wc -l" for w in _WORDS]
    lines += [json.dumps({"name": "bash", "arguments": {"command": f"ls {w}"}}) for w in _WORDS]
    lines += [json.dumps({"name": "write_file", "arguments": {"path": f"{w}.txt", "content": w}}) for w in _WORDS]
    lines += [f"def {w}(x):\n    return x + {i}\n" for i, w in enumerate(_WORDS)]
    lines += [str(i) for i in range(200)]
    lines += ["You are a helpful assistant.", "# Tools", "You may call one or more functions to assist with the user query."]
    return lines * 3


def build_tokenizer(vocab_size: int = 1024, template: str = "tiny"):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[],
    )
    fast.add_tokens(ADDED_TOKENS)
    if template != "tiny":  # the default build stays byte-identical (its weights' shapes depend on the vocabulary)
        fast.add_tokens(THINK_TOKENS)
    fast.chat_template = TEMPLATES[template]()
    return fast


# The final RMSNorm's gain of the tiny model `forge up` builds for itself. With Qwen2's init (std 0.02,
# tied embeddings) a logit is h.e with |h| = sqrt(hidden) * gain and |e| ~ 0.16, so at gain 1 every
# next-token distribution is near uniform (entropy 6.84 of a possible 6.85 nats) and no LoRA can move
# a logit by more than ~1.3: GRPO has nothing to sharpen. At 8 the model has the peaked, repetitive
# distributions of a small trained LM (entropy ~0.5 at the first answer token), which a LoRA on the
# attention/MLP can steer: that is what makes `forge up --demo` visibly learn (docs/dashboard.md).
# The default build stays at 1.0: the tests' fixture model, whose fp32 logprob tolerances assume it.
LEARNABLE_NORM_GAIN = 8.0


# Enough for Claude Code's first request (~48.5k tokens with this tokenizer) and Codex's (~23.6k)
# with room for many turns. Qwen2 has no learned position table (RoPE), so the context length changes
# no weight: a model built with any context has the same weights for the same seed and size.
DEFAULT_CONTEXT = 131072


def build_tiny_model(path: str | Path, *, seed: int = 0, hidden_size: int = 64, layers: int = 2,
                     vocab_size: int = 1024, norm_gain: float = 1.0, context_length: int = DEFAULT_CONTEXT,
                     template: str = "tiny") -> Path:
    """Write a tiny Qwen2 model + tokenizer + chat template to `path` and return it.

    `norm_gain` is the final RMSNorm's weight: 1.0 is the plain random init, LEARNABLE_NORM_GAIN the
    peaked one `forge up` trains. `context_length` is `max_position_embeddings`, what the engine
    reports and enforces. `template`: one of TEMPLATES (the chat template the tokenizer carries)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars would clutter `forge model tiny`

    out = Path(path).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size, template)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context_length,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    if norm_gain != 1.0:
        with torch.no_grad():
            model.model.norm.weight.fill_(norm_gain)
    model.generation_config = GenerationConfig(
        eos_token_id=[config.eos_token_id, config.pad_token_id], pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
