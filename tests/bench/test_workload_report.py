"""The workload bench's report: percentiles, hits traced to the request whose answer they
served, and the equivalence check of what the provider received."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.workload_client import Result
from bench.workload_report import lossy_quality, meaning_changed, pct, served_wrong, summarize


@dataclass(frozen=True)
class Req:
    id: str
    api: str = "openai"
    group: str | None = None
    body: Any = None


def result(rid: str, text: str, ttft: float = 100.0) -> Result:
    return Result(rid, "chat", "openai", False, ttft_ms=ttft, e2e_ms=ttft * 2, text=text,
                  text_sha=text)


def run(name: str, results: list[Result], log: Path | None = None,
        record: Path = Path("/nonexistent"), upstream: list[Any] | None = None) -> dict[str, Any]:
    return {"name": name, "results": results, "warm_results": [], "upstream": upstream or [],
            "cpu_s": 1.0, "wall_s": 1.0, "warm_s": 0.0, "log": log, "record": record}


def log_file(tmp_path: Path, lines: list[dict[str, Any]]) -> Path:
    path = tmp_path / "gw.log"
    path.write_bytes(b"\n".join(orjson.dumps({"event": "request", **x}) for x in lines))
    return path


def test_percentiles_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (pct(values, 50), pct(values, 95), pct(values, 99)) == (50.0, 95.0, 99.0)
    assert pct([], 50) is None


def test_a_hit_is_wrong_only_when_its_answer_came_from_another_question(tmp_path: Path) -> None:
    by_id = {k: Req(k, group=g, body=k) for k, g in (("a", "g1"), ("b", "g1"), ("c", "g2"),
                                                     ("d", "g3"))}
    direct = run("direct", [result("a", "A"), result("b", "B"), result("c", "C"),
                            result("d", "D")])
    log = log_file(tmp_path, [{"request_id": "b", "cache": "hit", "cache_layer": "semantic"},
                              {"request_id": "d", "cache": "hit", "cache_layer": "semantic"}])
    # b got a's answer (a paraphrase: right), d got c's (another question: wrong)
    gw = run("default", [result("a", "A"), result("b", "A"), result("c", "C"), result("d", "C")],
             log=log)
    assert served_wrong(gw, direct, by_id) == 1
    summary = summarize(gw, direct, by_id)
    assert summary["hits"] == {"semantic": 2}
    assert summary["ratios"]["ttft_p50"] == 1.0


def test_what_the_provider_received_is_held_to_the_contract(tmp_path: Path) -> None:
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    record = tmp_path / "up.jsonl"
    same = {**body, "stream_options": {"include_usage": True}}
    changed = {**same, "messages": [{"role": "user", "content": "hello"}]}
    record.write_bytes(b"\n".join(orjson.dumps(
        {"path": "/v1/chat/completions", "headers": {"x-request-id": rid}, "body": b})
        for rid, b in (("a", same), ("b", changed), ("zz", same))))
    by_id = {"a": Req("a", body=body), "b": Req("b", body=body)}
    out = meaning_changed(run("default", [result("a", "x"), result("b", "y")], record=record),
                          by_id, {"gpt-4o": ("openai", "gpt-4o")}, compress=False)
    assert (out["checked"], out["changed"], out["unmatched"]) == (2, 1, 1)
    assert out["examples"][0].startswith("b: ")


def test_a_continuation_after_a_cut_is_counted_apart_not_as_a_change(tmp_path: Path) -> None:
    """The gateway's resend of a cut stream (its text so far as a final assistant message,
    max_tokens lowered) is the same request continued, not a request whose meaning changed."""
    body = {"model": "gpt-4o", "stream": True, "max_tokens": 256,
            "messages": [{"role": "user", "content": "hi"}]}
    record = tmp_path / "up.jsonl"
    resent = {**body, "max_tokens": 240, "continue_final_message": True,
              "add_generation_prompt": False,
              "messages": [*body["messages"], {"role": "assistant", "content": "the first"}]}
    record.write_bytes(b"\n".join(orjson.dumps(
        {"path": "/v1/chat/completions", "headers": {"x-request-id": "a"}, "body": b})
        for b in ({**body, "stream_options": {"include_usage": True}}, resent)))
    out = meaning_changed(run("default", [result("a", "x")], record=record),
                          {"a": Req("a", body=body)}, {"gpt-4o": ("openai", "gpt-4o")},
                          compress=False)
    assert (out["checked"], out["changed"], out["continuations"]) == (1, 0, 1)


@dataclass(frozen=True)
class Retrieval:
    id: str
    body: Any
    answers: tuple[str, ...]
    kind: str = "retrieval"
    api: str = "openai"
    group: str | None = None


def test_the_lossy_stages_are_judged_on_what_the_provider_received(tmp_path: Path) -> None:
    sent = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Paris. Rome. Q?"}]}
    kept = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Paris. Q?"}]}
    lost = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Rome. Q?"}]}
    record = tmp_path / "up.jsonl"
    record.write_bytes(b"\n".join(orjson.dumps(
        {"path": "/v1/chat/completions", "headers": {"x-request-id": rid}, "body": b})
        for rid, b in (("a", kept), ("b", lost))))
    by_id = {"a": Retrieval("a", sent, ("Paris",)), "b": Retrieval("b", sent, ("Paris",))}
    out = lossy_quality(run("every", [result("a", "x"), result("b", "y")], record=record), by_id)
    assert out == {"retrieval_answer_kept": 0.5, "retrieval_checked": 2, "rerouted_share": 0.5}


def test_repeated_rounds_pool_their_requests_and_compare_round_by_round() -> None:
    from bench.workload_report import gaps, pooled

    def rounds(name: str, ttfts: list[list[float]], cost: float) -> tuple[list, list]:
        runs = [run(name, [result(f"{name}{i}-{j}", "x", t) for j, t in enumerate(ts)])
                for i, ts in enumerate(ttfts)]
        summaries = [{**summarize(r, None, {}), "cost_usd": cost, "served_wrong": 0,
                      "meaning_changed": {"changed": 0}} for r in runs]
        return runs, summaries

    direct_runs, direct_sums = rounds("direct", [[100.0, 200.0], [300.0, 400.0]], 2.0)
    gw_runs, gw_sums = rounds("default", [[50.0, 100.0], [150.0, 200.0]], 1.0)
    pooled_gw = pooled(gw_runs, gw_sums, pooled(direct_runs, direct_sums))
    # nearest rank over all four requests of both rounds
    assert pooled_gw["ttft_p50"] == 100.0 and pooled_gw["requests"] == 4
    assert pooled_gw["ratios"]["ttft_p50"] == 0.5 and pooled_gw["cost_usd"] == 2.0
    assert pooled_gw["ratios"]["cost"] == 0.5
    assert pooled_gw["outcomes"] == {"ok": 4}
    assert gaps(gw_sums, direct_sums)["ttft_p50"] == [-0.5, -0.5]


def test_the_providers_own_time_is_told_from_what_the_proxy_added(tmp_path: Path) -> None:
    from bench.workload_report import provider_time

    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    record = tmp_path / "up.jsonl"
    # a warm-up call, then a 500 and its retry for "a", one call for "b"; "c" was a hit
    record.write_bytes(b"\n".join(orjson.dumps(
        {"path": "/v1/chat/completions", "headers": {"x-request-id": rid}, "body": body})
        for rid in ("w", "a", "a", "b")))
    stats = [{"status": 500, "ttft_ms": None}, {"status": 200, "ttft_ms": 300.0},
             {"status": 200, "ttft_ms": 500.0}]
    by_id = {k: Req(k, body=body) for k in "wabc"}
    log = log_file(tmp_path, [{"request_id": "c", "cache": "hit"}])
    gw = run("default", [result("a", "x", 310.0), result("b", "y", 520.0),
                         result("c", "x", 5.0)], log=log, record=record, upstream=stats)
    gw["warm_results"] = [result("w", "w")]
    assert provider_time(gw, by_id) == {"floor_ttft_p50": 300.0, "floor_ttft_p95": 500.0,
                                        "added_ttft_p50": 10.0}
