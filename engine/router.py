"""engine.kind = "router": N engine workers behind SGLang's own router (PyPI `sglang-router`, the Rust
binary; `pip install -e .[router]`), served as one engine URL.

    python -m openforge.engine.router --model M --port P --workers 2      # what EngineProcess launches

This process starts the workers (embedded engines, each supervised and restarted like the single
engine; or `engine.worker_urls`: SGLang servers already running), then the real router in
front of them (`python -m sglang_router.launch_router --worker-urls ...` on a private port), then a
thin front on P:

    POST /generate             -> the router, with the client's `X-SMG-Routing-Key: <rollout id>`
                                  (EngineClient sends it; the proxy passes the rollout id): the
                                  router's `manual` policy keeps every turn of a rollout on the
                                  worker that holds its prefix in its radix cache; a new rollout
                                  goes to the worker with the fewest rollouts (`--assignment-mode
                                  min_group`); a request without the header, any worker
    POST /load_lora_adapter,   -> every worker (the router forwards none of them: 404), and again
    /unload_lora_adapter,         to a worker that restarts, so every worker serves every adapter
    /update_weights_from_disk
    /flush_cache               -> the router (it flushes every worker itself)
    /health, /model_info, ...  -> the router's health; the first live worker's facts
    GET /router_workers        -> the workers' URLs and pids (tests, `forge engine`)

Why not the router's `cache_aware` policy: sglang-router 0.3.2 sent every /generate of a sequential
probe (input_ids or text, 6 different prompts) to the same worker: no spread at all. It stays
selectable (`engine.policy`) for SGLang workers under real load. See docs/cluster.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from openforge.engine.client import ROUTING_KEY_HEADER
from openforge.engine.serve import KEEP_ALIVE_S
from openforge.engine.sglang_api import API_KEY_ENV, ApiKeyMiddleware
from openforge.config import RouterEngineConfig, embedded_engine_config
from openforge.errors import EngineError, ForgeError
from openforge.ports import free_port

WORKER_KEY_ENV = "FORGE_WORKER_API_KEY"
_FAN_OUT = ("/load_lora_adapter", "/unload_lora_adapter", "/update_weights_from_disk")
_INFO = ("/model_info", "/get_model_info", "/server_info", "/get_server_info", "/v1/models")


def healthy_workers(listing: dict[str, Any]) -> list[str]:
    """The healthy worker URLs in the router's `GET /workers` answer."""
    return sorted(w["url"] for w in listing.get("workers", []) if w.get("is_healthy"))


def router_command(port: int, worker_urls: list[str], *, policy: str, api_key: str, log_level: str = "warn") -> list[str]:
    """The real router's argv: loopback only, health checks every second so a dead worker leaves
    the rotation at once, retries on another worker."""
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--worker-urls", *worker_urls, "--policy", policy, "--health-check-interval-secs", "1",
           "--health-failure-threshold", "1", "--health-success-threshold", "1", "--log-level", log_level]
    if policy == "manual":
        cmd += ["--assignment-mode", "min_group"]
    if api_key:  # the router sends it to the workers (they check it); the front checks clients
        cmd += ["--api-key", api_key]
    return cmd


def _die_with_parent() -> None:
    """preexec_fn: the router gets SIGTERM when this process dies, even by SIGKILL (Linux prctl)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Fleet:
    """The workers and the router: start, stop, and the adapters every worker must serve."""

    def __init__(self, config: RouterEngineConfig, *, api_key: str, log_dir: Path) -> None:
        self.config, self.log_dir = config, log_dir
        # The front's key (the run's, held by the proxy and trainer) and the workers' (SGLang's
        # --api-key; on a cluster a Secret in FORGE_WORKER_API_KEY): the same unless told otherwise.
        self.api_key = api_key
        self.worker_key = os.environ.get(WORKER_KEY_ENV) or api_key
        self.workers: list[Any] = []  # engine.supervisor.EngineProcess, when this process starts them
        self.worker_urls: list[str] = list(config.worker_urls)
        self.router: subprocess.Popen | None = None
        self.router_url = config.router_url.rstrip("/")
        self.adapters: dict[str, str] = {}  # name -> path, loaded on every worker

    @property
    def external(self) -> bool:
        """A router someone else runs (a cluster's, finding its workers by service discovery)."""
        return bool(self.config.router_url)

    def start(self) -> None:
        from openforge.engine.supervisor import EngineProcess

        if self.external:
            self._wait_router()
            return
        if not self.worker_urls:
            for i in range(self.config.workers):
                cfg = embedded_engine_config(self.config, port=0)
                worker = EngineProcess(cfg, log_path=self.log_dir / f"worker-{i}.log", api_key=self.worker_key)
                worker.on_restart.append(lambda w=worker: self._reload(w.url))
                self.workers.append(worker)
            for worker in self.workers:  # one at a time: each loads the model
                worker.start()
            self.worker_urls = [w.url for w in self.workers]
        port = free_port()
        self.router_url = f"http://127.0.0.1:{port}"
        cmd = router_command(port, self.worker_urls, policy=self.config.policy, api_key=self.worker_key)
        log = open(self.log_dir / "router.log", "ab")  # noqa: SIM115 - the child holds it
        try:
            self.router = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True, preexec_fn=_die_with_parent)
        except OSError as exc:
            raise EngineError(f"cannot start sglang-router: {exc}") from None
        finally:
            log.close()
        self._wait_router()

    def _wait_router(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        with httpx.Client(timeout=2.0) as http:
            while True:
                if self.router is not None and self.router.poll() is not None:
                    tail = (self.log_dir / "router.log").read_text(errors="replace").strip().splitlines()[-5:]
                    raise EngineError("sglang-router exited with code "
                                      f"{self.router.returncode}: {' | '.join(tail) or 'no output'}"
                                      + (" (pip install -e .[router])" if "No module named" in str(tail) else ""))
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    healthy = healthy_workers(http.get(f"{self.router_url}/workers", headers=self._auth()).json())
                    if healthy and (self.external or len(healthy) == len(self.worker_urls)):
                        self.worker_urls = self.worker_urls if not self.external else healthy
                        return
                if time.monotonic() > deadline:
                    raise EngineError(f"sglang-router did not register {len(self.worker_urls)} healthy workers "
                                      f"within {self.config.startup_timeout_s:g}s; see {self.log_dir / 'router.log'}")
                time.sleep(0.3)

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.worker_key}"} if self.worker_key else {}

    def _reload(self, url: str) -> None:
        """A restarted (or newly discovered) worker has no adapters: give it every one the others serve."""
        with httpx.Client(timeout=self.config.request_timeout_s, headers=self._auth()) as http:
            for name, path in self.adapters.items():
                http.post(f"{url}/load_lora_adapter", json={"lora_name": name, "lora_path": path})

    def stop(self) -> None:
        if self.router is not None and self.router.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.router.pid, 15)
            try:
                self.router.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.router.pid, 9)
        for worker in self.workers:
            worker.stop()


def create_front(fleet: Fleet) -> Any:
    """The ASGI app on the engine port (see the module docstring)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    http = httpx.AsyncClient(timeout=httpx.Timeout(fleet.config.request_timeout_s, connect=5.0),
                             headers=fleet._auth(), limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))

    def answer(r: httpx.Response) -> Response:
        return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))

    async def generate(request: Request) -> Response:
        body = await request.body()
        headers = {"content-type": "application/json"}
        # Passed through as the client sent it: the real router reads only this header (no body field).
        if (key := request.headers.get(ROUTING_KEY_HEADER)) is not None:
            headers[ROUTING_KEY_HEADER] = key
        # A worker that just died: the router answers 5xx ("error sending request") for the rollouts
        # pinned to it until its health check (every second) takes it out and the rollout is given
        # another worker. Nothing was generated, so the call is sent again, for up to ~15 s.
        deadline = time.monotonic() + 15.0
        while True:
            req = http.build_request("POST", f"{fleet.router_url}/generate", content=body, headers=headers)
            try:
                upstream = await http.send(req, stream=True)
            except httpx.HTTPError as exc:
                return JSONResponse({"error": {"message": f"router unreachable: {exc}"}}, status_code=503)
            if upstream.status_code < 500 or time.monotonic() > deadline:
                break
            await upstream.aclose()
            await asyncio.sleep(0.5)
        if "text/event-stream" not in upstream.headers.get("content-type", ""):
            content = await upstream.aread()
            await upstream.aclose()
            return Response(content, status_code=upstream.status_code, media_type=upstream.headers.get("content-type"))

        async def relay():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

        return StreamingResponse(relay(), status_code=upstream.status_code, media_type="text/event-stream")

    async def refresh() -> None:
        """An external router's workers come and go (service discovery): ask it, and give a new
        worker every adapter before it serves a rollout that asks for one."""
        if not fleet.external:
            return
        with contextlib.suppress(httpx.HTTPError, ValueError):
            now = healthy_workers((await http.get(f"{fleet.router_url}/workers")).json())
            for url in set(now) - set(fleet.worker_urls):
                await asyncio.to_thread(fleet._reload, url)
            fleet.worker_urls = now

    async def fan_out(request: Request) -> Response:
        await refresh()
        if not fleet.worker_urls:
            return JSONResponse({"success": False, "error_message": "the router lists no healthy worker"},
                                status_code=503)
        body = await request.body()
        answers = await asyncio.gather(*(http.post(f"{url}{request.url.path}", content=body,
                                                   headers={"content-type": "application/json"})
                                         for url in fleet.worker_urls), return_exceptions=True)
        for url, r in zip(fleet.worker_urls, answers):
            if isinstance(r, BaseException):
                return JSONResponse({"success": False, "error_message": f"worker {url}: {r}"}, status_code=503)
            if r.status_code != 200 or (r.headers.get("content-type", "").startswith("application/json")
                                        and r.json().get("success") is False):
                return answer(r)
        if request.url.path == "/load_lora_adapter":
            got = await request.json()
            fleet.adapters[got["lora_name"]] = got["lora_path"]
        elif request.url.path == "/unload_lora_adapter":
            fleet.adapters.pop((await request.json()).get("lora_name"), None)
        return answer(answers[0])  # type: ignore[arg-type]

    async def info(request: Request) -> Response:
        for url in fleet.worker_urls:
            with contextlib.suppress(httpx.HTTPError):
                return answer(await http.get(f"{url}{request.url.path}"))
        return JSONResponse({"error": {"message": "no worker answers"}}, status_code=503)

    async def health(request: Request) -> Response:
        with contextlib.suppress(httpx.HTTPError):
            r = await http.get(f"{fleet.router_url}/health")
            return Response(status_code=200 if r.status_code == 200 else 503)
        return Response(status_code=503)

    async def flush(request: Request) -> Response:
        return answer(await http.post(f"{fleet.router_url}/flush_cache"))

    async def workers(request: Request) -> Response:
        return JSONResponse({"router": fleet.router_url, "policy": fleet.config.policy,
                             "workers": [{"url": u, "pid": w.pid if w else None} for u, w in
                                         zip(fleet.worker_urls, fleet.workers or [None] * len(fleet.worker_urls))]})

    async def watch() -> None:
        while True:
            await asyncio.sleep(5.0)
            await refresh()

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        watcher = asyncio.create_task(watch())
        yield
        watcher.cancel()
        await http.aclose()

    app = Starlette(routes=[
        Route("/generate", generate, methods=["POST", "PUT"]),
        *(Route(p, fan_out, methods=["POST"]) for p in _FAN_OUT),
        *(Route(p, info, methods=["GET"]) for p in _INFO),
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health, methods=["GET"]),
        Route("/flush_cache", flush, methods=["GET", "POST"]),
        Route("/router_workers", workers, methods=["GET"]),
    ], lifespan=lifespan)
    if fleet.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=fleet.api_key)
    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openforge.engine.router", description=__doc__.splitlines()[0])
    p.add_argument("--config-json", required=True, help="the RouterEngineConfig as JSON")
    p.add_argument("--log-dir", required=True)
    p.add_argument("--parent-pid", type=int, default=0)
    args = p.parse_args(argv)
    if args.parent_pid:
        from openforge.engine.__main__ import exit_with_parent

        exit_with_parent(args.parent_pid)
    import signal

    import uvicorn

    config = RouterEngineConfig.model_validate_json(args.config_json)
    api_key = os.environ.pop(API_KEY_ENV, "")
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(config, api_key=api_key, log_dir=log_dir)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        fleet.start()
        print(f"engine: router ({config.policy}) at http://{config.host}:{config.port} over "
              f"{', '.join(fleet.worker_urls)}", flush=True)
        server = uvicorn.Server(uvicorn.Config(create_front(fleet), host=config.host, port=config.port,
                                               log_level="warning", access_log=False,
                                               timeout_keep_alive=KEEP_ALIVE_S))
        server.run()
    except ForgeError as exc:
        print(f"engine: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
