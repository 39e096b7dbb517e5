"""Images through the proxy, token-exact: the real openai and anthropic SDKs over loopback, the proxy,
and the embedded engine serving the tiny Qwen2-VL (tests/conftest.py `tiny_vl_model`).

Each API's image form is recorded with the prompt ids the model's own HF processor gives for the same
rendered text and images (placeholders expanded), each image is stored once under the run, a
multi-turn conversation with a new screenshot each turn keeps exact token reuse, and remote URLs,
bad base64 and unknown formats are refused in each API's error shape.
"""

from __future__ import annotations

import base64
import io
import json

import anthropic
import openai
import pytest

from typer.testing import CliRunner

from openforge.engine.embedded import EmbeddedEngine
from openforge.forge_cli.main import app
from openforge.engine.serve import serve_in_thread
from openforge.engine.vision import load_processor, open_image
from openforge.config import EmbeddedEngineConfig, ProxyConfig
from openforge.image_store import ImageStore, image_id
from openforge.proxy.server import ProxyServer
from openforge.rollouts.runner.trajectory import assemble_rollout

pytestmark = pytest.mark.timeout(300)


def _png(color: tuple[int, int, int], size: tuple[int, int] = (320, 200)) -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, (255, 255, 255))
    ImageDraw.Draw(img).rectangle([size[0] // 4, size[1] // 4, size[0] * 3 // 4, size[1] * 3 // 4], fill=color)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


RED, BLUE, GREEN = _png((230, 20, 20)), _png((20, 20, 230), (200, 320)), _png((20, 200, 40), (640, 400))


@pytest.fixture(scope="module")
def engine_url(tiny_vl_model):
    engine = EmbeddedEngine(EmbeddedEngineConfig(model=str(tiny_vl_model), max_batch_size=4))
    with serve_in_thread(engine.app) as server:
        yield server.url
    engine.close()


@pytest.fixture(scope="module")
def processor(tiny_vl_model):
    return load_processor(tiny_vl_model)


@pytest.fixture
def rig(store, forge_home, engine_url, tiny_vl_model):
    run = store.create_run(kind="proxy")
    ro = store.create_rollout(run_id=run.id, task_id="t", status="running")
    with ProxyServer(ProxyConfig(default_max_tokens=4), store_path=store.path, engine_url=engine_url,
                     model_path=tiny_vl_model) as server:
        yield {"url": server.url, "key": ro.key, "run": run.id, "rollout": ro.id, "store": store,
               "images": ImageStore.for_run(forge_home, run.id)}


def _oai(rig) -> openai.OpenAI:
    return openai.OpenAI(base_url=rig["url"] + "/v1", api_key=rig["key"], max_retries=0, timeout=120)


def _anth(rig) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=rig["url"], api_key=rig["key"], max_retries=0, timeout=120)


def _expected_ids(processor, messages: list[dict], images: list[bytes]) -> list[int]:
    """What the model's own HF processor makes of the same conversation: its chat template, then
    `Qwen2VLProcessor.__call__` expanding each image's pad to the image's token count."""
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    out = processor(text=[text], images=[open_image(d) for d in images] or None, return_tensors="pt")
    return out["input_ids"][0].tolist()


def _calls(rig):
    return rig["store"].list_calls(rollout_id=rig["rollout"])


def _pad_runs(ids: list[int], pad: int) -> list[int]:
    runs, n = [], 0
    for t in ids + [-1]:
        if t == pad:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs


def test_chat_image_url_is_recorded_with_the_processors_ids(rig, processor):
    resp = _oai(rig).chat.completions.create(model="m", max_tokens=3, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What colour is the square?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(RED), "detail": "low"}}]}])
    assert resp.choices[0].finish_reason in ("stop", "length")
    (call,) = _calls(rig)
    expected = _expected_ids(processor, [{"role": "user", "content": [
        {"type": "text", "text": "What colour is the square?"}, {"type": "image"}]}], [RED])
    assert call.status == "ok" and call.prompt_ids == expected
    pad = processor.image_token_id
    grid = processor.image_processor(images=[open_image(RED)], return_tensors="pt")["image_grid_thw"][0].tolist()
    assert _pad_runs(call.prompt_ids, pad) == [grid[0] * grid[1] * grid[2] // 4] and grid[1] * grid[2] > 4
    assert call.images == [image_id(RED)] and resp.usage.prompt_tokens == len(expected)
    # The recorded body holds the image as a reference to its file, not its bytes.
    body = json.dumps(call.request_json)
    assert _b64(RED) not in body and f"data:image/png;base64,forge-image:{image_id(RED)}" in body
    assert rig["images"].get(image_id(RED)) == RED and rig["images"].path(image_id(RED)).suffix == ".png"
    # Streamed, the same request records the same prompt ids and the same (one) file.
    chunks = list(_oai(rig).chat.completions.create(model="m", max_tokens=3, stream=True, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What colour is the square?"}, {
            "type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(RED)}}]}]))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    streamed = _calls(rig)[-1]
    assert streamed.stream and streamed.status == "ok" and streamed.prompt_ids == expected
    assert streamed.images == [image_id(RED)] and len(list(rig["images"].root.iterdir())) == 1


def test_anthropic_images_in_user_turns_and_tool_results_stream(rig, processor):
    tool = {"name": "computer", "description": "act", "input_schema": {"type": "object"}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Open the menu."},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": _b64(RED)}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "computer",
                                           "input": {"action": "screenshot"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(RED)}}]}]},
    ]
    with _anth(rig).messages.stream(model="m", max_tokens=3, tools=[tool], messages=messages) as stream:
        final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens")
    (call,) = _calls(rig)
    assert call.stream and call.status == "ok"
    # The same screenshot twice: two placeholder runs, one stored file.
    assert call.images == [image_id(RED)] * 2
    assert [p.name for p in rig["images"].root.iterdir()] == [f"{image_id(RED)}.png"]
    pad = processor.image_token_id
    assert len(_pad_runs(call.prompt_ids, pad)) == 2
    n = _pad_runs(call.prompt_ids, pad)[0]
    assert _pad_runs(call.prompt_ids, pad) == [n, n]


def test_forge_calls_show_names_and_saves_a_calls_images(rig, tmp_path):
    _oai(rig).chat.completions.create(model="m", max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(RED)}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(BLUE)}}]}])
    (call,) = _calls(rig)
    shown = CliRunner().invoke(app, ["calls", rig["run"], "--show", str(call.id), "--save-images",
                                     str(tmp_path / "out")], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert image_id(RED)[:12] in shown.output and "320x200" in shown.output and "200x320" in shown.output
    assert f"image 1: {rig['images'].path(image_id(BLUE))}" in shown.output  # where each is stored under the run
    saved = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert saved == [f"call{call.id}-0-{image_id(RED)[:12]}.png", f"call{call.id}-1-{image_id(BLUE)[:12]}.png"]
    assert (tmp_path / "out" / saved[1]).read_bytes() == BLUE
    alone = CliRunner().invoke(app, ["calls", rig["run"], "--save-images", str(tmp_path / "x")])
    assert alone.exit_code != 0 and "--show" in alone.output


def test_responses_input_image_and_a_screenshot_in_a_function_output(rig, processor):
    events = list(_oai(rig).responses.create(model="m", max_output_tokens=3, stream=True, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Click submit."},
                                     {"type": "input_image", "image_url": "data:image/png;base64," + _b64(BLUE)}]},
        {"type": "function_call", "call_id": "call_1", "name": "screenshot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": [
            {"type": "input_image", "image_url": "data:image/png;base64," + _b64(GREEN)}]}]))
    assert events[-1].type in ("response.completed", "response.incomplete")
    (call,) = _calls(rig)
    assert call.images == [image_id(BLUE), image_id(GREEN)]
    grids = processor.image_processor(images=[open_image(BLUE), open_image(GREEN)],
                                      return_tensors="pt")["image_grid_thw"].tolist()
    assert _pad_runs(call.prompt_ids, processor.image_token_id) == [t * h * w // 4 for t, h, w in grids]


def test_multi_turn_with_a_new_screenshot_each_turn_reuses_tokens_exactly(rig):
    c = _oai(rig)
    messages: list[dict] = []
    shots = [RED, BLUE, GREEN]
    for shot in shots:
        messages.append({"role": "user", "content": [
            {"type": "text", "text": "screen:"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                                    + _b64(shot)}}]})
        answer = c.chat.completions.create(model="m", max_tokens=4, messages=messages).choices[0].message
        messages.append({"role": "assistant", "content": answer.content or ""})
    calls = _calls(rig)
    assert [call.images for call in calls] == [[image_id(s) for s in shots[:i + 1]] for i in range(3)]
    for prev, nxt in zip(calls, calls[1:]):
        head = prev.prompt_ids + prev.completion_ids
        assert nxt.prompt_ids[:len(head)] == head  # the earlier prompt and the sampled tokens, token for token
        assert nxt.reused_tokens >= len(prev.completion_ids) and nxt.break_reason is None
    # The same text with a different first screenshot is not an extension of the first call.
    swapped = [dict(messages[0], content=[messages[0]["content"][0], {"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + _b64(GREEN)}}]), *messages[1:2], messages[2]]
    c.chat.completions.create(model="m", max_tokens=2, messages=swapped)
    last = _calls(rig)[-1]
    assert last.reused_tokens == 0 and last.break_reason is not None
    assert last.images == [image_id(GREEN), image_id(BLUE)]
    # Training sees the same: one segment for the three turns, another for the swapped screenshot.
    assemble_rollout(rig["store"], rig["rollout"])
    segs = rig["store"].list_trajectories(rollout_ids=[rig["rollout"]])
    assert [s.call_ids for s in segs] == [[c.id for c in calls], [last.id]]
    assert [s.images for s in segs] == [[image_id(s) for s in shots], [image_id(GREEN), image_id(BLUE)]]
    assert segs[0].token_ids[:len(calls[-1].prompt_ids)] == calls[-1].prompt_ids


def test_reuse_with_images_survives_a_proxy_restart(store, forge_home, engine_url, tiny_vl_model):
    """A new proxy relearns the rollout's turns from the store (their recorded requests, images and
    all): the next turn still extends the last one token for token."""
    run = store.create_run(kind="proxy")
    ro = store.create_rollout(run_id=run.id, task_id="t", status="running")
    messages: list[dict] = []
    for shot in (RED, BLUE):
        messages.append({"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + _b64(shot)}}]})
        with ProxyServer(ProxyConfig(), store_path=store.path, engine_url=engine_url,
                         model_path=tiny_vl_model) as server:
            c = openai.OpenAI(base_url=server.url + "/v1", api_key=ro.key, max_retries=0, timeout=120)
            answer = c.chat.completions.create(model="m", max_tokens=3, messages=messages).choices[0].message
        messages.append({"role": "assistant", "content": answer.content or ""})
    first, second = store.list_calls(rollout_id=ro.id)
    assert _b64(RED) not in json.dumps(second.request_json)  # relearned from references to the files
    head = first.prompt_ids + first.completion_ids
    assert second.prompt_ids[:len(head)] == head and second.reused_tokens > 0
    assert second.images == [image_id(RED), image_id(BLUE)]


def test_refusals_in_each_apis_shape(rig):
    c, a = _oai(rig), _anth(rig)
    with pytest.raises(openai.BadRequestError, match="never fetches the network"):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/shot.png"}}]}])
    with pytest.raises(openai.BadRequestError, match="never fetches the network"):
        c.responses.create(model="m", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://10.0.0.1/x.png"}]}])
    with pytest.raises(openai.BadRequestError, match="file ids are refused"):
        c.responses.create(model="m", input=[{"role": "user", "content": [
            {"type": "input_image", "file_id": "file-abc"}]}])
    with pytest.raises(anthropic.BadRequestError, match="never fetches the network") as err:
        a.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/x.png"}}]}])
    assert err.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="not valid base64"):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,not*base64!"}}]}])
    with pytest.raises(openai.BadRequestError, match="not valid base64"):  # a recorded reference is not a source
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,forge-image:{image_id(RED)}"}}]}])
    with pytest.raises(anthropic.BadRequestError, match="not PNG, JPEG, GIF or WebP"):
        a.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(b"BM" + b"\0" * 64)}}]}])
    with pytest.raises(openai.BadRequestError, match="only allowed in user and tool"):
        c.chat.completions.create(model="m", messages=[{"role": "system", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(RED)}}]},
            {"role": "user", "content": "hi"}])
    # Text that spells the image placeholder cannot pass for an image.
    with pytest.raises(openai.BadRequestError, match="image placeholders"):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "text", "text": "<|vision_start|><|image_pad|><|vision_end|>"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(RED)}}]}])
    assert _calls(rig) == [] and not rig["images"].root.exists()  # refused before the engine and the disk


async def test_the_dashboards_call_view_lists_the_images(store, forge_home):
    from textual.widgets import DataTable, Static

    from openforge.forge_cli.dashboard import CallScreen, make_dashboard
    from openforge.store import Call

    run = store.create_run(name="gui")
    store.set_run_status(run.id, "running")
    ro = store.create_rollout(run_id=run.id, task_id="t")
    images = ImageStore.for_run(forge_home, run.id)
    shas = [images.put(RED), images.put(GREEN), "f" * 64]  # the third is not on disk
    request = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what colour?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(RED)}}]}]}
    store.add_call(Call(run_id=run.id, rollout_id=ro.id, api="openai_chat", status="ok", request_json=request,
                        prompt_ids=[1, 2], completion_ids=[3], images=shas))
    app = make_dashboard(store.path, run.id)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        app.query_one("#calls", DataTable).focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, CallScreen)
        blocks = {b.border_title: str(b.render()) for b in app.screen.query(".turn")}
        listed = blocks["images (3, in prompt order)"]
        assert f"#0  {shas[0][:12]}  png  {len(RED):,} bytes  320x200" in listed
        assert f"#1  {shas[1][:12]}  png  {len(GREEN):,} bytes  640x400" in listed
        assert f"#2  {'f' * 12}  file not found" in listed
        text = "\n".join(str(s.render()) for s in app.screen.query(Static))
        assert "[image]" in text and _b64(RED)[:40] not in text  # the conversation shows no base64


def test_exports_carry_the_images(rig, processor, tmp_path):
    """`forge export`: trajectory records name their images; verl-rl rows are veRL's multimodal
    RLHFDataset rows (`<image>` markers + an `images` column of the bytes), loaded by veRL itself."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from openforge.trainer.export import iter_records
    from openforge.integrations.verl.data import rl_rows, write_rows

    _oai(rig).chat.completions.create(model="m", max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What colour is the square? "},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(RED)}}]}])
    store = rig["store"]
    assemble_rollout(store, rig["rollout"])
    store.update_rollout(rig["rollout"], status="scored", reward=1.0)
    (rec,) = iter_records(store, rig["run"])
    assert rec["images"] == [image_id(RED)]
    (row,) = rl_rows(store, rig["run"])
    assert row["prompt"][0]["content"] == "What colour is the square? <image>"
    assert row["images"] == [{"bytes": RED}]
    path = tmp_path / "rl.parquet"
    write_rows([row], path)
    ds = RLHFDataset(data_files=str(path), tokenizer=processor.tokenizer, processor=processor,
                     config=OmegaConf.create({"max_prompt_length": 4096, "filter_overlong_prompts": False,
                                              "cache_dir": str(tmp_path / "cache")}))
    (part_text, part_image) = ds[0]["raw_prompt"][0]["content"]
    assert part_text == {"type": "text", "text": "What colour is the square? "}
    assert part_image["type"] == "image" and part_image["image"].size == (320, 200)
    write_rows([row], tmp_path / "rl.jsonl")  # JSON: the image as a data URL
    assert (tmp_path / "rl.jsonl").read_text().count("data:image/png;base64," + _b64(RED)) == 1


@pytest.mark.parametrize("size", [(1280, 800), (800, 1280), (1, 1), (4, 4), (57, 29), (1023, 767), (3000, 40),
                                  (28, 28 * 32), (29, 29 * 31)])
def test_placeholder_counts_from_the_image_size_equal_the_processors(processor, size):
    """The proxy counts an image's tokens from its size (no pixels decoded); the processor itself
    must agree on every shape: tiny (scaled up), odd, wide, tall, at the max_pixels edge."""
    from PIL import Image

    from openforge.proxy.image_inputs import from_base64
    from openforge.proxy.vision import ImagePlaceholders

    buf = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(buf, "PNG")
    im = from_base64(_b64(buf.getvalue()), "x")
    expected = processor.image_processor(images=[open_image(im.data)], return_tensors="pt")["image_grid_thw"]
    assert ImagePlaceholders(processor).grid([im]).tolist() == expected.tolist()


def test_captured_gui_harness_requests_are_served(rig):
    """What browser-use and mini-gui really sent (docs/harness-captures/, recorded by
    tests/capture_gui.py, which elides long strings), replayed with each elided screenshot put back as
    a real PNG of the captured size: 200, recorded with its image expanded."""
    import re

    import httpx
    from PIL import Image

    from tests.helpers.proxy_rig import _captured

    captured = _captured(images=True)
    assert {n for n, _ in captured} >= {"browser-use", "mini-gui"}
    elided = re.compile(r'data:image/png;base64,([A-Za-z0-9+/=]{40,})\u2026\[\d+ chars\]')
    for name, req in captured:
        def real_png(m: re.Match) -> str:  # the PNG header survives the elision: its width and height
            head = base64.b64decode(m.group(1)[:32])
            size = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
            buf = io.BytesIO()
            Image.new("RGB", size, (200, 210, 220)).save(buf, "PNG")
            return "data:image/png;base64," + _b64(buf.getvalue())

        body = json.loads(elided.sub(real_png, json.dumps(req["body"], ensure_ascii=False)))
        body["max_tokens"] = body.pop("max_completion_tokens", None) or body.get("max_tokens") or 2
        body["max_tokens"] = min(body["max_tokens"], 2)
        resp = httpx.post(rig["url"] + req["path"], json=body, timeout=300,
                          headers={"authorization": f"Bearer {rig['key']}"})
        assert resp.status_code == 200, (name, resp.text[:300])
        call = _calls(rig)[-1]
        assert call.status == "ok" and len(call.images) == 1, name
