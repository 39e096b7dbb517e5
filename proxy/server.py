"""`ProxyServer`: the proxy on uvicorn in a background thread, for `forge up`, `forge proxy` and tests.

    server = ProxyServer(config.proxy, store_path=db, engine_url=engine.url, model_path=model_dir,
                         uds=run_dir / "proxy.sock", engine_key=key)
    server.start()          # returns once it accepts connections
    ... harnesses use server.url, or the unix socket server.uds (bound into sandboxes) ...
    server.stop()

One app serves both listeners: TCP on `config.host` (127.0.0.1) and, with `uds`, a unix socket, which
is how a sandbox without a network reaches it.
"""

from __future__ import annotations

from pathlib import Path

from engine.client import EngineClient
from engine.serve import ServerHandle, serve_in_thread
from openforge.config import ProxyConfig
from openforge.errors import ConfigError, ForgeError
from proxy.connections import deadline_protocol


def load_tokenizer(model_path: str | Path):  # -> PreTrainedTokenizerBase
    """The served model's tokenizer (and chat template), from its checkpoint directory."""
    from transformers import AutoTokenizer

    path = Path(model_path).expanduser()
    if not path.is_dir():
        raise ConfigError(f"model directory not found: {path}")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a tokenizer from {path}: {str(exc).splitlines()[0]}") from None


class ProxyServer:
    def __init__(self, config: ProxyConfig, *, store_path: str | Path, engine_url: str, model_path: str | Path,
                 served_model: str | None = None, uds: str | Path | None = None,
                 engine_key: str | None = None) -> None:
        self.config = config
        self.store_path = Path(store_path)
        self.engine_url = engine_url
        self.engine_key = engine_key
        self.model_path = Path(model_path)
        self.uds = str(uds) if uds is not None else None
        self.served_model = served_model or config.served_model_name
        self._handle: ServerHandle | None = None
        self.app = None  # the Starlette app once started (tests read app.state.proxy)
        self.interrupted_on_start = 0

    @property
    def url(self) -> str:
        if self._handle is None:
            raise ForgeError("the proxy is not running (call start() first)")
        return self._handle.url

    def start(self) -> ProxyServer:
        from proxy.app import create_app

        if self._handle is not None:
            return self
        engine = EngineClient(self.engine_url, timeout=self.config.call_timeout_s, api_key=self.engine_key)
        app = create_app(self.config, store_path=self.store_path, engine=engine,
                         tokenizer=load_tokenizer(self.model_path), served_model=self.served_model,
                         close_engine=True)
        self.app = app
        self.interrupted_on_start = app.state.proxy.interrupted_on_start
        self._handle = serve_in_thread(app, self.config.host, self.config.port, uds=self.uds,
                                       http=deadline_protocol(self.config.read_timeout_s))
        return self

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.stop()
            self._handle = None

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
