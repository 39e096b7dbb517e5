"""engine/tiny_vl.py: the tiny Qwen2-VL (`forge model tiny-vl`) loads like a real Qwen2-VL checkpoint: its chat
template marks an image, its processor expands the image to one pad per 28x28 pixels (at most MAX_PIXELS), and the
model reads the pixels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from openforge.engine.tiny_vl import MAX_PIXELS, build_tiny_vl_model
from openforge.engine.vision import load_processor


def test_an_image_is_marked_expanded_and_read_by_the_model(tiny_vl_model: Path) -> None:
    from transformers import AutoModelForImageTextToText

    processor = load_processor(tiny_vl_model)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what colour?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<|vision_start|><|image_pad|><|vision_end|>what colour?" in text
    assert text.endswith("<|im_start|>assistant\n")
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    small = processor(text=[text], images=[Image.new("RGB", (112, 56), "red")], return_tensors="pt")
    assert int((small["input_ids"] == pad).sum()) == (112 // 28) * (56 // 28)  # one token per 28x28 pixels
    big = processor(text=[text], images=[Image.new("RGB", (1024, 768), "red")], return_tensors="pt")
    assert int((big["input_ids"] == pad).sum()) <= MAX_PIXELS // (28 * 28)  # a screenshot is resized down

    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model).eval()
    blue = processor(text=[text], images=[Image.new("RGB", (112, 56), "blue")], return_tensors="pt")
    with torch.no_grad():
        red_logits, blue_logits = (model(**inputs).logits[0, -1] for inputs in (small, blue))
    assert red_logits.shape == (len(processor.tokenizer),)
    assert not torch.allclose(red_logits, blue_logits)  # the answer depends on the pixels


def test_a_hidden_size_its_heads_cannot_split_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        build_tiny_vl_model(tmp_path / "m", hidden_size=48)
    assert not (tmp_path / "m").exists()
