"""Every config key says what it is, and `forge config show` prints each with its description."""

from __future__ import annotations

import tomllib

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from openforge.config import (DockerSandboxConfig, ForgeConfig, KubernetesSandboxConfig, LocalSandboxConfig,
                              describe_toml)
from openforge.environment import forge_env
from openforge.forge_cli.main import app

def sections() -> list[type[BaseModel]]:
    """ForgeConfig and every model it holds, with each sandbox backend's (the union's members)."""
    found: list[type[BaseModel]] = [ForgeConfig, LocalSandboxConfig, DockerSandboxConfig, KubernetesSandboxConfig]
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
            "EngineConfig", "KubernetesSandboxConfig"} <= names


@pytest.mark.parametrize("sandbox", ["local", "docker", "kubernetes"])
def test_config_show_prints_every_key_under_its_description(sandbox: str) -> None:
    res = CliRunner().invoke(app, ["--set", f"sandbox.type={sandbox}", "config", "show"], catch_exceptions=False)
    assert res.exit_code == 0
    text = res.stdout
    config = ForgeConfig.model_validate({"sandbox": {"type": sandbox}})
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
