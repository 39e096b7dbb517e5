"""Build a tiny, real-architecture vision-language model offline: `forge model tiny-vl PATH`.

A Qwen2-VL (`Qwen2VLForConditionalGeneration`, random weights, 0.22M parameters, 80k of them in the
vision tower): the real vision tower (Conv3d patch embedding, vision blocks with 2-D rotary, the 2x2
patch merger) and the real language model with M-RoPE (three position axes: time, height, width).
Its processor is the real `Qwen2VLProcessor` with the PIL image processor
(`Qwen2VLImageProcessorPil`: torchvision stays out of the venv), a byte-level BPE tokenizer trained
here like engine/tiny.py's, with Qwen2-VL's special tokens (`<|vision_start|>`, `<|image_pad|>`,
`<|vision_end|>`, `<|im_start|>`, `<|im_end|>`, ...), and Qwen2-VL-Instruct's real chat template (an
image content part renders as `<|vision_start|><|image_pad|><|vision_end|>`, which the processor
expands to the image's N pads).
Everything is written with `save_pretrained`, so `AutoModelForImageTextToText.from_pretrained(path)`,
`AutoTokenizer` and `AutoImageProcessor` load it like a real Qwen2-VL checkpoint; engine/vision.py
`load_processor(path)` gives its `Qwen2VLProcessor` (`AutoProcessor` itself needs torchvision in
transformers 5, for Qwen2-VL's video processor; not tried here, where torchvision is left out).

Why `max_pixels` is small (MAX_PIXELS = 28*28*32): one language token of Qwen2-VL covers 28x28
pixels (14-pixel patches merged 2x2), and the real processor's default (28*28*1280) lets a screenshot
be up to 1,280 tokens. A GUI agent sends one screenshot per turn and the tiny model runs on 2 CPU
cores, so here an image is resized (aspect kept, by the processor's own smart_resize) to at most 32
tokens: a 1280x800 screenshot becomes 196x112 pixels, 14x8 patches, 7x4 = 28 tokens (the test
checks it). Small images are scaled up to at least MIN_PIXELS (4 tokens). A real checkpoint keeps its
own processor settings; nothing else in OpenForge assumes these numbers: everything reads the grid
the processor returns.
"""

from __future__ import annotations

import json
from pathlib import Path

# Qwen2-VL-Instruct's chat template (Qwen/Qwen2-VL-7B-Instruct, chat_template.json; Qwen2.5-VL uses
# the same): a string content is text; a list content renders each part, images as one placeholder
# run, videos likewise, text as is. It has no tool section: Qwen2-VL's agents put actions in text.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2-VL's special tokens, in its order (ids differ: the vocabulary is tiny).
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]

PATCH_SIZE = 14
MERGE_SIZE = 2
# One language token per (PATCH_SIZE * MERGE_SIZE)^2 = 28x28 pixels.
MIN_PIXELS = 28 * 28 * 4  # at least 4 image tokens
MAX_PIXELS = 28 * 28 * 32  # at most 32 image tokens (module doc: why)

# Words a GUI agent and the tests' visual tasks use, so they are single tokens of the tiny vocabulary.
_GUI_WORDS = (
    "red green blue yellow black white colour color square circle image picture screenshot screen "
    "click type scroll press key button link page web browser window desktop menu text field form "
    "submit search open close select left right up down top bottom x y action done answer what which"
).split()


def _corpus() -> list[str]:
    from openforge.engine.tiny import text_corpus

    lines = text_corpus()
    lines += [" ".join(_GUI_WORDS[i:i + 10]) for i in range(0, len(_GUI_WORDS), 10)] * 6
    lines += [json.dumps({"action": a, "x": i * 7, "y": i * 3}) for i, a in enumerate(["click", "type", "scroll", "press"])] * 3
    lines += [f"What colour is the square? {c}" for c in ("red", "green", "blue")] * 6
    return lines


def build_vl_tokenizer(vocab_size: int = 1024):  # -> PreTrainedTokenizerFast
    """The tiny byte-level BPE with Qwen2-VL's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from openforge.engine.tiny import ADDED_TOKENS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None, additional_special_tokens=[])
    fast.add_tokens(ADDED_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_vl_model(path: str | Path, *, seed: int = 0, hidden_size: int = 64, layers: int = 2,
                        vision_dim: int = 32, vision_depth: int = 2, vocab_size: int = 1024,
                        norm_gain: float = 1.0, context_length: int = 32768,
                        min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS) -> Path:
    """Write a tiny Qwen2-VL model + processor (tokenizer, PIL image processor, chat template) to `path`.

    `norm_gain`: the language model's final RMSNorm weight (engine/tiny.py LEARNABLE_NORM_GAIN: why a
    larger gain gives GRPO something to sharpen). Same arguments, same files."""
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if hidden_size % 4 or (hidden_size // 4) % 8:
        raise ValueError(f"hidden_size must be a multiple of 32 (4 heads, head_dim a multiple of 8), got {hidden_size}")
    out = Path(path).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_vl_tokenizer(vocab_size)
    tid = tokenizer.convert_tokens_to_ids
    head_dim = hidden_size // 4
    # M-RoPE splits head_dim/2 rotary frequencies among (time, height, width); Qwen2-VL's 128-dim
    # heads use [16, 24, 24], the same 2:3:3 proportions as [2, 3, 3] for 16-dim heads.
    unit = head_dim // 16
    mrope = [2 * unit, 3 * unit, 3 * unit]
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=context_length, rope_theta=1000000.0,
            rope_scaling={"type": "mrope", "mrope_section": mrope}, tie_word_embeddings=True,
            eos_token_id=tid("<|im_end|>"), pad_token_id=tid("<|endoftext|>"), bos_token_id=None,
        ),
        vision_config=dict(
            depth=vision_depth, embed_dim=vision_dim, hidden_size=hidden_size, num_heads=2, mlp_ratio=2,
            patch_size=PATCH_SIZE, spatial_merge_size=MERGE_SIZE, temporal_patch_size=2, in_channels=3,
        ),
        image_token_id=tid("<|image_pad|>"), video_token_id=tid("<|video_pad|>"),
        vision_start_token_id=tid("<|vision_start|>"), vision_end_token_id=tid("<|vision_end|>"),
        tie_word_embeddings=True, eos_token_id=tid("<|im_end|>"), pad_token_id=tid("<|endoftext|>"),
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).to(torch.float32)
    if norm_gain != 1.0:
        with torch.no_grad():
            model.model.language_model.norm.weight.fill_(norm_gain)
    model.generation_config = GenerationConfig(
        eos_token_id=[tid("<|im_end|>"), tid("<|endoftext|>")], pad_token_id=tid("<|endoftext|>"),
    )
    model.save_pretrained(out)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels,
                                               patch_size=PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=2)
    # The processor is saved as its parts (what Qwen2VLProcessor.save_pretrained writes, less the
    # video processor: transformers 5 cannot build that one without torchvision, which this venv
    # leaves out). engine/vision.py load_processor puts them together again as a Qwen2VLProcessor.
    image_processor.save_pretrained(out)
    tokenizer.save_pretrained(out)  # tokenizer files + chat_template.jinja
    return out
