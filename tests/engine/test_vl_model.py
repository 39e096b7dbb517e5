"""The tiny Qwen2-VL (engine/tiny_vl.py) and the one way images become model inputs (engine/vision.py)."""

from __future__ import annotations

import io
import json

import pytest
import torch
from typer.testing import CliRunner

from openforge.engine.vision import (VisionTokens, check_expanded, expand_image_tokens, load_processor, mm_token_type_ids,
                           pixel_inputs)
from openforge.image_store import ImageError


def _png(color: tuple[int, int, int], size: tuple[int, int]) -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, (255, 255, 255))
    ImageDraw.Draw(img).rectangle([size[0] // 4, size[1] // 4, size[0] * 3 // 4, size[1] * 3 // 4], fill=color)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the square?"}]}]


@pytest.fixture(scope="module")
def loaded(tiny_vl_model):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(tiny_vl_model), dtype=torch.float32).eval()
    return model, load_processor(tiny_vl_model)


def test_tiny_vl_is_a_real_qwen2_vl_with_its_processor(tiny_vl_model, loaded):
    model, proc = loaded
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert type(proc).__name__ == "Qwen2VLProcessor"
    assert type(proc.image_processor).__name__ == "Qwen2VLImageProcessorPil"
    assert any("visual" in n for n, _ in model.named_parameters())
    assert model.config.text_config.rope_parameters["mrope_section"] == [2, 3, 3]
    text = proc.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                    "<|vision_start|><|image_pad|><|vision_end|>What colour is the square?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    for tok in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|im_start|>", "<|im_end|>"):
        assert len(proc.tokenizer.encode(tok)) == 1, tok
    assert json.loads((tiny_vl_model / "preprocessor_config.json").read_text())["size"]["longest_edge"] == 28 * 28 * 32


def test_a_prompt_with_one_image_runs_forward_and_pads_match_the_grid(loaded):
    model, proc = loaded
    image = _png((230, 20, 20), (1280, 800))  # a screenshot's size: 28 tokens at this max_pixels
    text = proc.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    from PIL import Image

    enc = proc(text=[text], images=[Image.open(io.BytesIO(image))], return_tensors="pt")
    grid = enc["image_grid_thw"]
    merge = proc.image_processor.merge_size
    n_pads = int((enc["input_ids"] == model.config.image_token_id).sum())
    assert n_pads == int(grid.prod()) // merge ** 2 == 28
    assert grid.tolist() == [[1, 8, 14]]
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (1, enc["input_ids"].shape[1], model.config.text_config.vocab_size)
    assert torch.isfinite(logits).all()

    # engine/vision.py gives the processor's own ids and pixels, from the bytes
    single = proc.tokenizer.encode(text)
    assert expand_image_tokens(single, [image], proc) == enc["input_ids"][0].tolist()
    pixels, grid2 = pixel_inputs([image], proc)
    assert torch.equal(grid2, grid) and torch.equal(pixels, enc["pixel_values"])
    tokens = VisionTokens.from_processor(proc)
    assert tokens == VisionTokens.from_config(model.config)
    assert torch.equal(mm_token_type_ids(enc["input_ids"], tokens), enc["mm_token_type_ids"].to(torch.int32))
    [(start, stop)] = check_expanded(enc["input_ids"][0].tolist(), grid, tokens)
    assert stop - start == 28


def test_image_changes_the_output_and_two_images_expand_in_order(loaded):
    model, proc = loaded
    red, blue = _png((230, 20, 20), (100, 60)), _png((20, 20, 230), (60, 200))
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]}]
    single = proc.tokenizer.encode(proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))
    ids = expand_image_tokens(single, [red, blue], proc)
    pixels, grid = pixel_inputs([red, blue], proc)
    runs = check_expanded(ids, grid, VisionTokens.from_processor(proc))
    assert [b - a for a, b in runs] == [int(g.prod()) // 4 for g in grid] and grid.tolist()[0] != grid.tolist()[1]
    t = torch.tensor([ids])
    types = mm_token_type_ids(t, VisionTokens.from_processor(proc))
    with torch.no_grad():
        a = model(input_ids=t, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=types).logits[0, -1]
        swapped, grid_s = pixel_inputs([blue, red], proc)
        ids_s = expand_image_tokens(single, [blue, red], proc)
        ts = torch.tensor([ids_s])
        b = model(input_ids=ts, pixel_values=swapped, image_grid_thw=grid_s,
                  mm_token_type_ids=mm_token_type_ids(ts, VisionTokens.from_processor(proc))).logits[0, -1]
    assert not torch.allclose(a, b)


def test_mismatches_are_clear_errors(loaded):
    _, proc = loaded
    img = _png((20, 200, 40), (64, 64))
    single = proc.tokenizer.encode(proc.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False))
    with pytest.raises(ImageError, match="1 image placeholder"):
        expand_image_tokens(single, [img, img], proc)
    expanded = expand_image_tokens(single, [img], proc)
    with pytest.raises(ImageError, match="already expanded"):
        expand_image_tokens(expanded, [img], proc)
    _, grid = pixel_inputs([_png((20, 200, 40), (640, 640))], proc)
    with pytest.raises(ImageError, match="tokens but the image is"):
        check_expanded(expanded, grid, VisionTokens.from_processor(proc))
    with pytest.raises(ImageError, match="not a readable image"):
        pixel_inputs([b"\x89PNG\r\n\x1a\nbroken"], proc)


def test_cli_builds_the_tiny_vl_model(tmp_path):
    from openforge.forge_cli.main import app

    target = tmp_path / "vl"
    result = CliRunner().invoke(app, ["model", "tiny-vl", str(target)])
    assert result.exit_code == 0, result.output
    assert "Qwen2-VL" in result.output and "at most 32 tokens" in result.output
    config = json.loads((target / "config.json").read_text())
    assert config["architectures"] == ["Qwen2VLForConditionalGeneration"] and "vision_config" in config
    again = CliRunner().invoke(app, ["model", "tiny-vl", str(target)])
    assert again.exit_code != 0 and "not empty" in again.output
