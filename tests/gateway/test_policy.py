"""Live policy reload through a running gateway: valid edits take effect, broken ones are
rejected and the old policy keeps serving."""

from __future__ import annotations

import openai

from gateway.policy import PolicyStore
from gateway.testing.configmap import ConfigMapVolume
from tests.conftest import wait_generation

MESSAGES = [{"role": "user", "content": "hi"}]
FAIL_ONCE = {"x-fake-fail-times": "1", "x-fake-status": "503"}


def _ask(gw, key: str):
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c:
        return c.chat.completions.create(model="fake-model", messages=MESSAGES,
                                         extra_headers={**FAIL_ONCE, "x-fake-key": key})


def _edit(gw, text: str) -> None:
    store: PolicyStore = gw.gateway.policies
    generation = store.generation
    gw.policy_path.write_text(text)
    assert wait_generation(store, generation), "the edit was never picked up"


def test_valid_edit_takes_effect_and_broken_edit_keeps_the_old_policy(make_gateway, fake):
    gw = make_gateway(watch=True)
    _ask(gw, "before")  # max_attempts = 3: one retry hides the 503
    assert gw.logged(1)[0]["retries"] == 1

    _edit(gw, 'version = "v2"\n[retry]\nmax_attempts = 1\n')
    assert gw.gateway.policy.version == "v2"
    try:
        _ask(gw, "after")
    except openai.InternalServerError:
        pass
    else:
        raise AssertionError("with max_attempts = 1 the 503 must reach the client")

    _edit(gw, "[retry]\nmax_attempts = 'many'\n")  # broken: rejected
    assert gw.gateway.policy.version == "v2"
    assert gw.gateway.policies.rejected == 1
    try:
        _ask(gw, "broken")
    except openai.InternalServerError:
        pass  # still max_attempts = 1: the old policy serves
    metrics = gw.gateway.metrics.render().decode()
    assert 'gateway_policy_reloads_total{result="rejected"} 1.0' in metrics


async def test_every_configmap_update_is_picked_up(tmp_path):
    import asyncio

    volume = ConfigMapVolume(tmp_path, "policy.toml")
    volume.publish('version = "v1"\n')
    store = PolicyStore(tmp_path / "policy.toml")
    ready = asyncio.Event()
    watching = asyncio.create_task(store.watch(ready))
    await ready.wait()
    try:
        for version in ("v2", "v3", "v4"):
            generation = store.generation
            volume.publish(f'version = "{version}"\n')
            for _ in range(200):  # the watcher reloads on its own: wait for that
                if store.generation > generation and store.current.version == version:
                    break
                await asyncio.sleep(0.05)
            assert store.current.version == version
    finally:
        watching.cancel()
