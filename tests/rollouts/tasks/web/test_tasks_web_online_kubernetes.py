"""An online-only web task in a pod (issue 32): with `sandbox.allow_internet` on the Kubernetes backend,
the rollout's browser opens the task's start URL over the pod's own network, mini-gui acts on the page,
and the task's judge grades it from its screens; without the switch the run is refused before any pod.

On the API double (tests/k8s_double, per-pod networks, as tests/sandbox/test_gui_kubernetes.py): the start page is
served inside the pod, on its own loopback, by the task's setup (tests/rollouts/tasks/web/test_tasks_web_online.py's task,
the same one the Docker test runs). No relay is involved: an online task has no site on the host.

Forge creates no NetworkPolicy at run time: a cluster's operator applies the one printed by
`python -m openforge.sandbox.k8s_manifests network-policy --config forge.toml` (docs/kubernetes.md). So
the policy is checked as that command prints it for the run's own forge.toml: the internet variant for
this run, the deny-all-but-the-proxy variant for the same file with the switch off. The double enforces
no policy (the pod reaches only the node's proxy port here); that the egress rule opens the web is untested.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from tests.k8s_double import IMAGE_ENV, KubeDouble
from tests.k8s_double.network import NODE_IP
from tests.helpers.kubernetes import make_config, needs_gui, needs_pods
from tests.helpers.judges import GREEN, RED, _PageJudge, _top_left, online_task, page_judge_url  # noqa: F401

import openforge.sandbox.site_relay as site_relay
from openforge.config import ForgeConfig, HarnessConfig, JudgeConfig
from openforge.errors import ConfigError
from openforge.rollouts.runner.runner import RolloutRunner, RolloutSpec
from openforge.sandbox.k8s_manifests import main as k8s_manifests_main
from openforge.store import Store


def _printed_policy(tmp_path: Path, cfg: ForgeConfig, capsys: pytest.CaptureFixture[str]) -> dict:
    """The NetworkPolicy `network-policy --config` prints for this run's config, written as forge.toml."""
    import tomli_w

    path = tmp_path / "forge.toml"
    sandbox = cfg.sandbox.model_dump(mode="json", exclude_defaults=True)
    path.write_text(tomli_w.dumps({"sandbox": {"type": "kubernetes", **sandbox}, "proxy": {"port": 8700}}))
    capsys.readouterr()
    assert k8s_manifests_main(["network-policy", "--config", str(path)]) == 0
    return json.loads(capsys.readouterr().out)


@needs_pods
@needs_gui
@pytest.mark.timeout(240)
def test_an_online_task_in_a_pod_opens_its_start_page_and_is_judged(tmp_path: Path, store: Store, tiny_vl_model: Path,
                                                                    page_judge_url: str,  # noqa: F811
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """mini-gui (grid mode) in a pod, through the real runner and proxy (reached at the node's address)
    to a scripted engine over the tiny Qwen2-VL: `click(0)`, `done()`. The pod's browser opened the
    start URL (the first screen is the start page, served only in the pod), the click turned it green,
    and the WebVoyager judge, shown those screens, scored 1. The same run with the switch off is
    refused before any pod; the policy printed for each config is its variant."""
    from openforge.engine.scripted import ScriptedEngine
    from openforge.engine.serve import serve_in_thread
    from openforge.proxy.server import ProxyServer

    _PageJudge.seen.clear()
    engine = ScriptedEngine(tiny_vl_model, ["click(0)", "done()"])
    cfg = ForgeConfig()
    cfg.harness = HarnessConfig(name="mini-gui", max_turns=3, max_tokens=8,
                                extra_args=["--grid", "2x2", "--no-tools", "--max-side", "512"])
    cfg.judge = JudgeConfig(url=page_judge_url, model="judge")
    cfg.proxy.max_context_tokens = 65536
    cfg.runner.time_limit_scale = 5.0
    venv = tuple(sorted({sys.prefix, sys.base_prefix}))
    path = f"PATH={sys.prefix}/bin:" + IMAGE_ENV[0].removeprefix("PATH=")  # the image's python3: the venv's
    with serve_in_thread(engine.app) as eng, ProxyServer(cfg.proxy, store_path=store.path, engine_url=eng.url,
                                                          model_path=tiny_vl_model) as proxy:
        proxy_port = int(proxy.url.rsplit(":", 1)[1].strip("/"))
        double = KubeDouble(tmp_path / "pods", ro_binds=venv, image_env=(path, *IMAGE_ENV[1:]), pod_network=True,
                            node_ports=(proxy_port,))
        double.start()
        try:
            cfg.sandbox = make_config(double, tmp_path, proxy_url=f"http://{NODE_IP}:{proxy_port}",
                                      start_timeout_s=60)
            off = RolloutRunner(store, config=cfg, proxy_url=proxy.url)
            with pytest.raises(ConfigError, match="online-only .* set sandbox.allow_internet = true"):
                asyncio.run(off.run(store.create_run(kind="eval").id, [RolloutSpec(online_task())]))
            assert not any(method == "POST" for method, _, _ in double.requests)  # no pod was asked for
            deny = _printed_policy(tmp_path, cfg, capsys)
            cfg.sandbox = cfg.sandbox.model_copy(update={"allow_internet": True})
            run = store.create_run(kind="eval")
            [ro] = asyncio.run(RolloutRunner(store, config=cfg, proxy_url=proxy.url).run(
                run.id, [RolloutSpec(online_task())]))
            posted = [p for method, p, _ in double.requests if method == "POST"]
        finally:
            double.stop()
    shown = [[_top_left(png) for png in images] for images in _PageJudge.seen]
    assert (ro.status, ro.reward, ro.sandbox) == ("scored", 1.0, "kubernetes"), (ro.error, ro.stdout,
                                                                                ro.stderr[-3000:], shown)
    assert posted == ["/api/v1/namespaces/openforge/pods"]  # one pod; no relay, no other object
    calls = store.list_calls(rollout_id=ro.id)
    assert len(calls) == 2 and all(c.status == "ok" and len(c.images) == 1 for c in calls)
    assert shown == [[RED, GREEN]]  # the judge saw the start page, then the page after the click
    [row] = store.list_judgements(rollout_id=ro.id)
    assert row.score == 1.0 and row.reply.endswith("SUCCESS") and not row.error
    assert not double.pods and not site_relay._relays
    # The policy for each: the switch adds exactly one egress rule, TCP 80/443 to public addresses only.
    online = _printed_policy(tmp_path, cfg, capsys)
    assert online["metadata"]["name"] == deny["metadata"]["name"]  # applying one replaces the other
    (*kept, web) = online["spec"]["egress"]
    assert kept == deny["spec"]["egress"] and len(kept) == 2  # the proxy's port and DNS, as before
    assert web["ports"] == [{"protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 443}]
    [block] = web["to"]
    assert block["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(block["ipBlock"]["except"])
