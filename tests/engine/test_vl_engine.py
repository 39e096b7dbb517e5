"""The embedded engine serving a Qwen2-VL model with SGLang's `image_data` (issue 18), over real HTTP.

- logprobs with images == a fresh fp32 HF forward pass of the same tokens and pixels (<= 1e-4); greedy
  picks the argmax of that pass
- concurrent requests (text, one image, another image, two images) == their serial results
- the prefix cache never serves one image's KV for another behind the same placeholder tokens
- chunked prefill keeps an image's placeholder run in one chunk (chunks of 16 tokens here)
- refusals in SGLang's error shape: runs vs images, run length vs image, remote URL, file path
- a LoRA adapter on the language part changes outputs and matches PEFT's own forward pass
"""

from __future__ import annotations

import asyncio
import base64
import io
import shutil
from pathlib import Path

import httpx
import pytest
import torch

from openforge.engine import scheduler as scheduler_module
from openforge.engine.client import EngineClient
from openforge.engine.embedded import EmbeddedEngine
from openforge.engine.protocol import BadRequest
from openforge.engine.serve import serve_in_thread
from openforge.config import EmbeddedEngineConfig
from openforge.errors import EngineRejected

SAMPLE = {"temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True}
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
RED, BLUE, GREEN = (230, 20, 20), (20, 20, 230), (20, 200, 40)


def _png(color: tuple[int, int, int], size: tuple[int, int], dot: tuple[int, int] | None = None) -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, (255, 255, 255))
    ImageDraw.Draw(img).rectangle([size[0] // 4, size[1] // 4, size[0] * 3 // 4, size[1] * 3 // 4], fill=color)
    if dot:
        img.putpixel(dot, (0, 0, 0))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _make_peaky_vl(src: Path, dst: Path, seed: int = 1) -> Path:
    """The tiny VLM with wider weights: different prompts and images give visibly different tokens."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(src), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name and ".ln" not in name:
                std = 0.1 if "visual" in name else 0.35
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    model.save_pretrained(dst)
    return dst


def _make_language_lora(model_dir: Path, dst: Path, seed: int = 3) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    base = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=4, lora_dropout=0.0,
                        target_modules=r".*language_model.*\.(q_proj|v_proj|o_proj|down_proj)")
    peft = get_peft_model(base, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    peft.save_pretrained(dst)
    return dst


@pytest.fixture(scope="module")
def vl(tmp_path_factory, tiny_vl_model):
    root = tmp_path_factory.mktemp("vl")
    model = _make_peaky_vl(Path(tiny_vl_model), root / "peaky")
    return {"model": model, "lora": _make_language_lora(model, root / "lora")}


@pytest.fixture(scope="module")
def served(vl):
    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(vl["model"]), max_batch_size=4))
    with serve_in_thread(engine.app) as server:
        yield engine, server.url
    engine.close()


class Reference:
    """A separate copy of the model and its processor, never touched by the engine: the ground truth."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

        self.model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.processor = AutoImageProcessor.from_pretrained(str(path))
        self.config = self.model.config

    def _pixels(self, images: list[bytes]) -> dict[str, torch.Tensor]:
        from PIL import Image

        if not images:
            return {}
        pil = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
        out = self.processor(images=pil, return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    def prompt(self, text: str, images: list[bytes], prefix: str = "") -> list[int]:
        """A user turn with each image's placeholder run expanded as the HF processor expands it."""
        c, tok = self.config, self.tokenizer
        ids = tok.encode(f"<|im_start|>user\n{prefix}")
        grids = self._pixels(images).get("image_grid_thw", torch.zeros(0, 3, dtype=torch.long))
        merge = c.vision_config.spatial_merge_size
        for g in grids:
            ids += [c.vision_start_token_id] + [c.image_token_id] * (int(g.prod()) // merge ** 2) + [c.vision_end_token_id]
        return ids + tok.encode(f"{text}<|im_end|>\n<|im_start|>assistant\n")

    def logprobs(self, prompt: list[int], output: list[int], images: list[bytes], model=None) -> torch.Tensor:
        """log-softmax rows predicting each output token, from one fresh forward pass."""
        ids = torch.tensor([prompt + output])
        with torch.no_grad():
            logits = (model or self.model)(input_ids=ids, mm_token_type_ids=(ids == self.config.image_token_id).int(),
                                           **self._pixels(images)).logits[0].float()
        return torch.log_softmax(logits, -1)[len(prompt) - 1:len(prompt) - 1 + len(output)]

    def check(self, out, prompt: list[int], images: list[bytes], model=None) -> None:
        lp = self.logprobs(prompt, out.output_ids, images, model)
        expected = lp[torch.arange(len(out.output_ids)), torch.tensor(out.output_ids)]
        assert (expected - torch.tensor(out.logprobs)).abs().max().item() <= 1e-4


@pytest.fixture(scope="module")
def ref(vl):
    return Reference(vl["model"])


A, B = _png(RED, (120, 80)), _png(BLUE, (120, 80))  # same size: the same placeholder tokens
TALL = _png(GREEN, (56, 112))


@pytest.mark.parametrize("images", [[A], [A, TALL]], ids=["one-image", "two-images"])
async def test_logprobs_with_images_equal_a_fresh_forward_pass(served, ref, images):
    _, url = served
    prompt = ref.prompt("what colour is the square", images)
    async with EngineClient(url) as client:
        sampled = await client.generate(prompt, SAMPLE, image_data=[_url(b) for b in images])
        greedy = await client.generate(prompt, GREEDY, image_data=[_url(b) for b in images])
        streamed = [d async for d in client.stream_generate(prompt, GREEDY, image_data=[_url(b) for b in images])]
        # SGLang's other pre-tokenized form: one <|image_pad|> per image, expanded by the engine.
        pad = ref.config.image_token_id
        collapsed = [t for i, t in enumerate(prompt) if t != pad or prompt[i - 1] != pad]
        short = await client.generate(collapsed, GREEDY, image_data=[_url(b) for b in images])
    ref.check(sampled, prompt, images)
    ref.check(greedy, prompt, images)
    lp = ref.logprobs(prompt, greedy.output_ids, images)
    assert greedy.output_ids == lp.argmax(-1).tolist()  # greedy = the argmax of the fresh pass, token by token
    assert [t for d in streamed for t in d.token_ids] == greedy.output_ids
    assert greedy.prompt_tokens == len(prompt)
    assert len(collapsed) == len(prompt) - prompt.count(pad) + len(images)
    assert short.output_ids == greedy.output_ids and short.prompt_tokens == len(prompt)


async def test_different_images_behind_the_same_placeholders_are_not_confused(served, ref):
    """Same text, same placeholder tokens, different pixels: the prefix cache is keyed by the image."""
    engine, url = served
    prefix = "look at the picture carefully and tell me " * 8  # a long shared head: the cache matters
    prompt_a, prompt_b = ref.prompt("which colour", [A], prefix), ref.prompt("which colour", [B], prefix)
    assert prompt_a == prompt_b and len(prompt_a) > 2 * scheduler_module.MIN_CACHED_PREFIX
    start = prompt_a.index(ref.config.image_token_id)
    async with EngineClient(url) as client:
        await client.flush_cache()
        first = await client.generate(prompt_a, GREEDY, image_data=[_url(A)])
        other = await client.generate(prompt_b, GREEDY, image_data=[_url(B)])
        again = await client.generate(prompt_a, GREEDY, image_data=[_url(A)])
    ref.check(first, prompt_a, [A])
    ref.check(other, prompt_b, [B])  # image B's own pass, not image A's cached KV
    assert other.logprobs != first.logprobs
    # B reused the text before its image, nothing of A's image; A's repeat reused its image too.
    assert other.meta["cached_tokens"] <= start
    assert again.meta["cached_tokens"] > start
    assert again.output_ids == first.output_ids
    ref.check(again, prompt_a, [A])


async def test_concurrent_mixed_requests_equal_serial(served, ref):
    _, url = served
    jobs = [(ref.prompt("hello there", []), []), (ref.prompt("what colour", [A]), [A]),
            (ref.prompt("what colour", [B]), [B]), (ref.prompt("compare them", [TALL, A]), [TALL, A]),
            (ref.prompt("a longer question about the image", [B]), [B])]
    async with EngineClient(url) as client:
        await client.flush_cache()
        serial = [await client.generate(p, GREEDY, image_data=[_url(b) for b in imgs]) for p, imgs in jobs]
        await client.flush_cache()
        together = await asyncio.gather(*[client.generate(p, GREEDY, image_data=[_url(b) for b in imgs])
                                          for p, imgs in jobs])
    for (prompt, imgs), one, many in zip(jobs, serial, together):
        assert many.output_ids == one.output_ids
        assert max(abs(a - b) for a, b in zip(many.logprobs, one.logprobs)) <= 1e-4
        ref.check(many, prompt, imgs)


async def test_chunked_prefill_keeps_each_image_run_in_one_chunk(served, ref, monkeypatch):
    engine, url = served
    monkeypatch.setattr(scheduler_module, "PREFILL_CHUNK", 16)  # chunk ends fall inside the image runs
    images = [A, TALL]
    prompt = ref.prompt("compare the two pictures please", images, prefix="first some words then ")
    passes: list[tuple[int, int]] = []  # (tokens, images) of each prompt forward pass
    forward = engine.scheduler._forward

    def recording(adapter, cache, **kw):
        if kw["input_ids"].shape[1] > 1:
            passes.append((kw["input_ids"].shape[1], len(kw.get("image_grid_thw", []))))
        return forward(adapter, cache, **kw)

    monkeypatch.setattr(engine.scheduler, "_forward", recording)
    async with EngineClient(url) as client:
        await client.flush_cache()
        out = await client.generate(prompt, SAMPLE, image_data=[_url(b) for b in images])
    ref.check(out, prompt, images)
    assert sum(n for n, _ in passes) == len(prompt) and len(passes) > 2
    assert sum(k for _, k in passes) == 2  # each image went in exactly one chunk, whole
    assert any(n > 16 for n, k in passes if k)  # a chunk grew to hold a run it would have cut


async def test_refusals_in_sglang_error_shape(served, ref, tmp_path):
    engine, url = served
    prompt = ref.prompt("what colour", [A])
    path = tmp_path / "a.png"
    path.write_bytes(A)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        async def refused(body: dict) -> str:
            resp = await http.post("/generate", json={"sampling_params": GREEDY, **body})
            assert resp.status_code == 400, resp.text
            return resp.json()["error"]["message"]

        assert "1 image placeholder run(s) but image_data has 2" in await refused(
            {"input_ids": prompt, "image_data": [_url(A), _url(B)]})
        assert "no image_data" in await refused({"input_ids": prompt})
        assert "tokens but the image is" in await refused({"input_ids": prompt, "image_data": [_url(TALL)]})
        assert "remote URL" in await refused({"input_ids": prompt, "image_data": ["https://example.com/a.png"]})
        assert "file paths" in await refused({"input_ids": prompt, "image_data": [str(path)]})
        assert "not a readable image" in await refused(
            {"input_ids": prompt, "image_data": ["data:image/png;base64," + base64.b64encode(b"nope").decode()]})
        cut = prompt[:prompt.index(ref.config.image_token_id)] + prompt[prompt.index(ref.config.vision_end_token_id):]
        assert "placeholder run" in await refused({"input_ids": cut, "image_data": [_url(A)]})
    async with EngineClient(url) as client:  # the client names the engine's reason
        with pytest.raises(EngineRejected, match="remote URL"):
            await client.generate(prompt, GREEDY, image_data=["http://127.0.0.1:1/a.png"])
    assert engine.scheduler.alive


async def test_image_data_to_a_text_model_is_refused(tiny_model):
    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(tiny_model)))
    try:
        with pytest.raises(BadRequest, match="does not take images"):
            await engine.start({"input_ids": [1, 2, 3], "image_data": [_url(A)]})
    finally:
        engine.close()


async def test_language_lora_changes_image_outputs_as_peft_does(served, ref, vl):
    from peft import PeftModel

    _, url = served
    prompt = ref.prompt("what colour is the square", [A])
    async with EngineClient(url) as client:
        base = await client.generate(prompt, GREEDY, image_data=[_url(A)])
        assert (await client.load_lora_adapter("vl-a", str(vl["lora"])))["success"]
        try:
            tuned = await client.generate(prompt, GREEDY, image_data=[_url(A)], lora_path="vl-a")
        finally:
            await client.unload_lora_adapter("vl-a")
    assert tuned.logprobs != base.logprobs
    from transformers import AutoModelForImageTextToText

    peft = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(str(vl["model"]), dtype=torch.float32),
                                     str(vl["lora"])).eval()
    ref.check(tuned, prompt, [A], model=peft)


def test_sglang_launcher_for_a_vlm(vl, tiny_model, tmp_path):
    """--enable-multimodal for a VLM folder only; the child gets SGLANG_MM_AVOID_RETOKENIZE=1."""
    import stat

    from openforge.engine.sglang import sglang_command
    from openforge.engine.supervisor import EngineProcess
    from openforge.config import SglangEngineConfig
    from openforge.errors import EngineError

    config = SglangEngineConfig(sglang_python="/opt/sgl/bin/python")
    assert "--enable-multimodal" in sglang_command(config, model_path=str(vl["model"]), port=1)
    assert "--enable-multimodal" not in sglang_command(config, model_path=str(tiny_model), port=1)
    assert "--enable-multimodal" not in sglang_command(config, model_path="Qwen/Qwen2-VL-2B-Instruct", port=1)
    # A stand-in for SGLang's python that records its argv and environment, then fails to start.
    seen = tmp_path / "seen.txt"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho \"$SGLANG_MM_AVOID_RETOKENIZE $*\" > {seen}\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    engine = EngineProcess(SglangEngineConfig(sglang_python=str(fake), startup_timeout_s=30),
                           model_path=str(vl["model"]), log_path=tmp_path / "s.log")
    with pytest.raises(EngineError, match="exited with code 3"):
        engine.start()
    line = seen.read_text()
    assert line.startswith("1 -m sglang.launch_server") and "--enable-multimodal" in line


def test_an_image_resent_is_decoded_once(served, ref, monkeypatch):
    """GUI agents resend every earlier screenshot: the engine decodes and processes each image once."""
    from openforge.engine import multimodal

    engine, _ = served
    calls = []
    real = multimodal.pixel_inputs

    def counting(images, processor):
        calls.append(len(images))
        return real(images, processor)

    monkeypatch.setattr(multimodal, "pixel_inputs", counting)
    image = _png(GREEN, (90, 70), dot=(3, 3))  # bytes no other test sends
    prompt = ref.prompt("again", [image, TALL])
    first = multimodal.prepare_images(engine.m, prompt, [_url(image), _url(TALL)], engine.images)
    second = multimodal.prepare_images(engine.m, prompt, [_url(image), _url(TALL)], engine.images)
    assert calls and sum(calls) <= 2 and len(calls) == 1  # the second request processed nothing
    assert second.key_ids == first.key_ids and torch.equal(second.positions, first.positions)
    assert all(torch.equal(a, b) for a, b in zip(first.pixel_values, second.pixel_values))


async def test_update_weights_from_disk_with_a_vlm(vl, ref, tmp_path):
    """New base weights of the same VLM: the answer is the new model's fresh pass, images and all."""
    other = _make_peaky_vl(vl["model"], tmp_path / "other", seed=7)
    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(vl["model"]), max_batch_size=2))
    prompt = ref.prompt("what colour is the square", [A])
    try:
        with serve_in_thread(engine.app) as server:
            async with EngineClient(server.url) as client:
                before = await client.generate(prompt, GREEDY, image_data=[_url(A)])
                assert (await client.update_weights_from_disk(str(other)))["success"]
                after = await client.generate(prompt, GREEDY, image_data=[_url(A)])
    finally:
        engine.close()
    assert after.logprobs != before.logprobs
    ref.check(after, prompt, [A], model=Reference(other).model)
