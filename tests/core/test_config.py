"""Every config key says what it is, and `forge config show` prints each with its description."""

from __future__ import annotations

import re
import tomllib

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from openforge.config import (DockerSandboxConfig, EmbeddedEngineConfig, ForgeConfig, KubernetesSandboxConfig,
                              LocalSandboxConfig, RouterEngineConfig, SglangEngineConfig, UrlEngineConfig,
                              describe_toml, embedded_engine_config, load_config, parse_override)
from openforge.errors import ConfigError
from openforge.environment import forge_env
from openforge.forge_cli.main import app

def sections() -> list[type[BaseModel]]:
    """ForgeConfig and every model it holds, with each sandbox backend's and engine kind's (the unions' members)."""
    found: list[type[BaseModel]] = [ForgeConfig, LocalSandboxConfig, DockerSandboxConfig, KubernetesSandboxConfig,
                                    EmbeddedEngineConfig, SglangEngineConfig, UrlEngineConfig, RouterEngineConfig]
    for field in ForgeConfig.model_fields.values():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found.append(field.annotation)
    return found


@pytest.mark.parametrize("section", sections(), ids=lambda s: s.__name__)
def test_every_field_has_a_description(section: type[BaseModel]) -> None:
    missing = [name for name, field in section.model_fields.items() if not (field.description or "").strip()]
    assert missing == [], f"{section.__name__} fields without a description: {missing}"


def test_sections_cover_the_whole_config() -> None:
    names = {s.__name__ for s in sections()}
    assert {"ProxyConfig", "HarnessConfig", "TasksConfig", "RunnerConfig", "TrainerConfig", "StoreConfig",
            "RouterEngineConfig", "KubernetesSandboxConfig"} <= names


@pytest.mark.parametrize("member", ["sandbox.type=local", "sandbox.type=docker", "sandbox.type=kubernetes",
                                    "engine.kind=embedded", "engine.kind=sglang", "engine.kind=url",
                                    "engine.kind=router"])
def test_config_show_prints_every_key_under_its_description(member: str) -> None:
    res = CliRunner().invoke(app, ["--set", member, "config", "show"], catch_exceptions=False)
    assert res.exit_code == 0
    text = res.stdout
    config = ForgeConfig.model_validate(parse_override(member))
    assert ForgeConfig.model_validate(tomllib.loads(text)) == config  # the output is the config, as TOML
    lines = text.splitlines()
    for model, header in [(config, None), *[(getattr(config, n), f"[{n}]") for n in ForgeConfig.model_fields
                                            if isinstance(getattr(config, n), BaseModel)]]:
        start = lines.index(header) + 1 if header else 0
        for name, field in type(model).model_fields.items():
            if isinstance(getattr(model, name), BaseModel):
                continue
            spellings = (f"{name} = ", f"# {name} = (unset)", f"[{header[1:-1]}.{name}]" if header else f"[{name}]")
            key = next(i for i in range(start, len(lines)) if lines[i].startswith(spellings))
            assert lines[key - 1] == f"# {field.description}", (header, name)


@pytest.mark.parametrize(("sets", "message"), [
    (["engine.tp_size=2"], 'engine.tp_size: not a key of engine.kind = "embedded" (sglang only)'),
    (["engine.kind=url", "engine.url=http://h:1", "engine.port=1"],
     'engine.port: not a key of engine.kind = "url" (embedded, sglang, router only)'),
    (["engine.kind=sglang", "engine.workers=3"], 'engine.workers: not a key of engine.kind = "sglang" (router only)'),
    (["engine.kind=gpu"], "engine.kind: unknown kind 'gpu'; choose embedded, sglang, url, router or remote"),
    (["engine.kind=router", "engine.router_workers=3"],
     "engine.router_workers: the router's keys have no prefix now: write engine.workers"),
    (["sandbox.image=x"], 'sandbox.image: not a key of sandbox.type = "local" (docker, kubernetes only)'),
])
def test_a_key_of_another_union_member_is_a_config_error(sets: list[str], message: str) -> None:
    blamed = next(item for item in sets if item.startswith(message.split(":")[0] + "="))  # the --set that set it
    with pytest.raises(ConfigError, match=re.escape(f"--set {blamed}: {message}")):
        load_config(None, sets=sets)


def test_engine_kind_picks_the_member_and_a_router_carries_its_workers_settings() -> None:
    config = load_config(None, sets=["engine.kind=router", "engine.workers=3", "engine.max_batch_size=4"])
    assert isinstance(config.engine, RouterEngineConfig) and config.engine.workers == 3
    assert isinstance(ForgeConfig().engine, EmbeddedEngineConfig)  # no kind: the embedded engine, as before
    worker = embedded_engine_config(config.engine, port=0)
    assert type(worker) is EmbeddedEngineConfig and worker.max_batch_size == 4


def test_unset_values_are_printed_commented_out() -> None:
    text = describe_toml(ForgeConfig())
    assert "# clip_eps_high = (unset)" in text and "# max_tokens_cap = (unset)" in text


def test_forge_env_reads_the_old_openforge_name_when_the_new_one_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORGE_IMAGE_CACHE", raising=False)
    monkeypatch.delenv("OPENFORGE_IMAGE_CACHE", raising=False)
    assert forge_env("FORGE_IMAGE_CACHE", "dflt") == "dflt"
    monkeypatch.setenv("OPENFORGE_IMAGE_CACHE", "/old")
    assert forge_env("FORGE_IMAGE_CACHE") == "/old"
    monkeypatch.setenv("FORGE_IMAGE_CACHE", "/new")
    assert forge_env("FORGE_IMAGE_CACHE") == "/new"
    with pytest.raises(ValueError):
        forge_env("IMAGE_CACHE")


def test_a_run_stored_before_the_engine_union_still_loads() -> None:
    from openforge.config import stored_config
    from openforge.errors import ConfigError

    # what `run.config_json` held: the flat [engine] table, every kind's keys, the router's prefixed
    flat = {"kind": "router", "model": "/m", "host": "127.0.0.1", "port": 0, "url": "", "dtype": "auto",
            "device": "cpu", "max_batch_size": 4, "seed": 0, "prefix_cache_mb": 64, "sglang_python": "python",
            "tp_size": 1, "max_lora_rank": 64, "sglang_args": [], "router_workers": 3, "router_worker_urls": [],
            "router_url": "", "router_policy": "round_robin"}
    config = stored_config({"engine": flat, "trainer": {"steps": 7}})
    assert (config.engine.kind, config.engine.workers, config.engine.policy) == ("router", 3, "round_robin")
    assert (config.engine.max_batch_size, config.trainer.steps) == (4, 7)
    embedded = stored_config({"engine": {**flat, "kind": "embedded"}})
    assert embedded.engine.kind == "embedded" and embedded.engine.prefix_cache_mb == 64
    with pytest.raises(ConfigError, match="stored config"):
        stored_config({"trainer": {"steps": "many"}})
