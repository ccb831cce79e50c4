"""What the workload bench reports per path: latency percentiles, outcomes, billed cost, cache
hits by layer, served-wrong hits and requests whose meaning changed (pure, over the results
of ``bench/workload.py``'s runs).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

__all__ = ["gaps", "gateway_log", "meaning_changed", "pct", "pool_rounds", "pooled",
           "print_pooled", "print_report", "provider_time", "served_wrong", "summarize"]


def pct(values: list[float], p: float) -> float | None:
    """The ``p``-th percentile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))]


def gateway_log(path: Path | None) -> dict[str, dict[str, Any]]:
    """The gateway's request log lines by request id (``event == "request"``)."""
    out: dict[str, dict[str, Any]] = {}
    if path is None or not path.exists():
        return out
    for line in path.read_bytes().splitlines():
        if not line.startswith(b"{"):
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if rec.get("event") == "request" and rec.get("request_id"):
            out[rec["request_id"]] = rec
    return out


def _text(content: Any) -> str:
    """A message's content as text: a string, or its blocks' text (markers left out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text") or orjson.dumps(
            {k: v for k, v in b.items() if k != "cache_control"}).decode()
            if isinstance(b, dict) else str(b) for b in content)
    return "" if content is None else orjson.dumps(content).decode()


def content_key(body: Any) -> tuple[int, str, str]:
    """What names a request when a proxy does not pass ``x-request-id`` on: its number of
    messages, its first and its last message's text (markers and serialisation aside)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return (0, "", "")
    return (len(messages), _text(messages[0].get("content")), _text(messages[-1].get("content")))


def recorded(run: dict[str, Any], by_id: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """Each body the provider received (``record`` lines, in order) with the request it
    belongs to: by ``x-request-id``, else by :func:`content_key` (the earliest measured or
    warm-up request of that content not yet matched); None when none. Read once per run
    (kept in it: hits, meaning and quality each ask)."""
    if "_recorded" in run:
        return run["_recorded"]  # type: ignore[no-any-return]
    record: Path = run["record"]
    if not record.exists():
        return []
    lines = [orjson.loads(line) for line in record.read_bytes().splitlines()]
    pending: dict[tuple[int, str, str], list[str]] = {}
    for r in [*run["warm_results"], *run["results"]]:
        pending.setdefault(content_key(by_id[r.id].body), []).append(r.id)
    out: list[tuple[str | None, Any]] = []
    for rec in lines:
        rid = (rec.get("headers") or {}).get("x-request-id")
        if rid is None:
            queue = pending.get(content_key(rec.get("body")))
            rid = queue.pop(0) if queue else None
        out.append((rid if rid in by_id else None, rec))
    run["_recorded"] = out
    return out


def hits(run: dict[str, Any], by_id: dict[str, Any]) -> dict[str, str]:
    """Measured request id -> how a proxy answered it without the provider: the gateway's
    cache layer (``exact``, ``semantic``) or ``coalesced``; for another proxy, ``cache``
    when the provider never received the request (:func:`recorded`). Worked out once per
    run (kept in it)."""
    if "_hits" not in run:
        run["_hits"] = _hits(run, by_id)
    return run["_hits"]  # type: ignore[no-any-return]


def _hits(run: dict[str, Any], by_id: dict[str, Any]) -> dict[str, str]:
    measured = [r for r in run["results"] if r.outcome == "ok"]
    if run["name"] == "direct":
        return {}
    log = gateway_log(run["log"])
    if log:
        out = {}
        for r in measured:
            rec = log.get(r.id) or {}
            if rec.get("cache") == "hit":
                out[r.id] = rec.get("cache_layer") or "exact"
            elif rec.get("coalesced") == "follower":
                out[r.id] = "coalesced"
        return out
    seen = {rid for rid, _ in recorded(run, by_id) if rid is not None}
    if not seen:
        return {}
    return {r.id: "cache" for r in measured if r.id not in seen}


def summarize(run: dict[str, Any], direct: dict[str, Any] | None,
              by_id: dict[str, Any]) -> dict[str, Any]:
    """Latency (ms), outcomes, cost (USD), hits, CPU (s) of one path; ratios to ``direct``."""
    results = run["results"]
    ok = [r for r in results if r.outcome == "ok" and r.ttft_ms is not None]
    ttft = [r.ttft_ms for r in ok]
    e2e = [r.e2e_ms for r in ok]
    s: dict[str, Any] = {
        "requests": len(results), "ok": len(ok),
        "ttft_p50": pct(ttft, 50), "ttft_p95": pct(ttft, 95), "ttft_p99": pct(ttft, 99),
        "e2e_p50": pct(e2e, 50), "e2e_p99": pct(e2e, 99),
        "outcomes": dict(Counter(r.outcome for r in results)),
        "warmup": {"requests": len(run["warm_results"]), "seconds": round(run["warm_s"], 1),
                   "outcomes": dict(Counter(r.outcome for r in run["warm_results"]))},
        "cost_usd": sum(u.get("cost_usd") or 0.0 for u in run["upstream"]),
        "upstream_requests": len(run["upstream"]),
        "upstream_faults": dict(Counter(str(u.get("fault")) for u in run["upstream"])),
        "cpu_s": run["cpu_s"], "wall_s": run["wall_s"],
        "hits": dict(Counter(hits(run, by_id).values())),
        "by_kind": {},
    }
    for kind in sorted({r.kind for r in results}):
        mine = [r.ttft_ms for r in ok if r.kind == kind]
        s["by_kind"][kind] = {"n": len(mine), "ttft_p50": pct(mine, 50), "ttft_p95": pct(mine, 95)}
    if direct is None:
        run["_summary"] = s  # the ratios' base: each path's summary reads it
    elif direct is not run:
        d = direct.get("_summary") or summarize(direct, None, by_id)
        s["ratios"] = {k: s[k] / d[k] for k in ("ttft_p50", "ttft_p95", "ttft_p99", "e2e_p50",
                                                 "e2e_p99") if s[k] and d[k]}
        if d["cost_usd"]:
            s["ratios"]["cost"] = s["cost_usd"] / d["cost_usd"]
    return s


def served_wrong(run: dict[str, Any], direct: dict[str, Any] | None,
                 by_id: dict[str, Any]) -> int | None:
    """Hits whose answer came from another question: the provider's answers are a function of
    the prompt, so an answer's text is traced to a request that got it from the provider (in
    this run, else in the direct run); a hit is right when that request is this one or a
    paraphrase of it (the same chat ``group``) or asked the very same (the same body)."""
    answered = hits(run, by_id)
    if not answered:
        return 0
    origin: dict[str, set[str | None]] = {}
    for source in (run, direct or {"results": [], "warm_results": []}):
        for r in [*source["warm_results"], *source["results"]]:
            if r.outcome == "ok" and r.id not in answered:
                origin.setdefault(r.text_sha, set()).add(r.id)
    wrong = 0
    for r in run["results"]:
        if r.id not in answered:
            continue
        sources = origin.get(r.text_sha, set())
        mine = by_id[r.id]
        if r.id in sources or any(
                (mine.group is not None and by_id[o].group == mine.group)
                or by_id[o].body == mine.body for o in sources):
            continue
        wrong += 1
    return wrong


def meaning_changed(run: dict[str, Any], by_id: dict[str, Any],
                    models: dict[str, tuple[str, str]], compress: bool) -> dict[str, Any]:
    """Each body the provider received on this path held against the client's request under
    the equivalence contract (tests/gateway/equivalence/contract.py): how many were checked,
    changed (the first few breaches quoted) or could not be matched to a request."""
    from tests.gateway.equivalence.contract import Allowed, check

    allowed = Allowed(models=frozenset(m for _, m in models.values()), compress=compress)
    out: dict[str, Any] = {"checked": 0, "changed": 0, "unmatched": 0, "continuations": 0,
                           "examples": []}
    measured = {r.id for r in run["results"]}
    for rid, rec in recorded(run, by_id):
        if rid is None:
            out["unmatched"] += 1
            continue
        if rid not in measured:
            continue
        req = by_id[rid]
        api = "anthropic" if rec.get("path", "").endswith("/messages") else "openai"
        if api != req.api:
            continue  # translated: not compared for equality (the contract's T rules)
        body = rec.get("body")
        if _continuation(req.body, body):
            out["continuations"] += 1  # the gateway's own resend after a cut (issue 48)
            continue
        out["checked"] += 1
        verdict = check(api, req.body, body, allowed)
        if verdict.error is not None:
            out["changed"] += 1
            if len(out["examples"]) < 3:
                out["examples"].append(f"{rid}: {verdict.error[:300]}")
    return out


def _continuation(sent: Any, received: Any) -> bool:
    """Whether ``received`` is a continuation of ``sent`` (gateway.continuation): its
    messages, one assistant text more at their end (a prefill, or continue_final_message)."""
    if not isinstance(sent, dict) or not isinstance(received, dict):
        return False
    mine, theirs = sent.get("messages") or [], received.get("messages") or []
    last = theirs[-1] if theirs else None
    return len(theirs) == len(mine) + 1 and isinstance(last, dict) \
        and last.get("role") == "assistant" and isinstance(last.get("content"), str)


def lossy_quality(run: dict[str, Any], by_id: dict[str, Any]) -> dict[str, Any]:
    """What the lossy stages did to the measured requests the provider received: retrieval
    prompts whose body still holds a gold answer (of those that held one as sent), and the
    share of requests sent to another model than the client named (routing's weak tier)."""
    measured = {r.id for r in run["results"]}
    kept = held = rerouted = sent = 0
    for rid, rec in recorded(run, by_id):
        if rid is None or rid not in measured:
            continue
        req, body = by_id[rid], rec.get("body") or {}
        sent += 1
        rerouted += body.get("model") != req.body.get("model")
        if req.kind == "retrieval" and req.answers:
            mine = orjson.dumps(req.body).decode()
            theirs = orjson.dumps(body).decode()
            if any(a in mine for a in req.answers):
                held += 1
                kept += any(a in theirs for a in req.answers)
    return {"retrieval_answer_kept": kept / held if held else None, "retrieval_checked": held,
            "rerouted_share": rerouted / sent if sent else None}


def provider_time(run: dict[str, Any], by_id: dict[str, Any]) -> dict[str, Any]:
    """How much of a path's TTFT is the provider's own: per measured request, the TTFT the
    provider drew for the last call that answered it (0 for a proxy's hit), and what the
    client saw on top (ms). ``floor_ttft_p50``/``_p95``: the path's TTFT p50/p95 had its proxy added
    nothing; ``added_ttft_p50``: the median of client - provider over requests the provider
    answered."""
    stats = run["upstream"]
    lines = recorded(run, by_id)
    drawn: dict[str, float] = {}
    # the provider's record and its stats list the same requests in the same order; the
    # stats hold the measured window only: its tail
    for (rid, _), stat in zip(lines[len(lines) - len(stats):], stats, strict=True):
        if rid is not None and stat.get("status") == 200 and stat.get("ttft_ms") is not None:
            drawn[rid] = stat["ttft_ms"]
    answered = hits(run, by_id)
    floor, added = [], []
    for r in run["results"]:
        if r.outcome != "ok" or r.ttft_ms is None:
            continue
        if r.id in answered:
            floor.append(0.0)
        elif r.id in drawn:
            floor.append(drawn[r.id])
            added.append(r.ttft_ms - drawn[r.id])
    return {"floor_ttft_p50": pct(floor, 50), "floor_ttft_p95": pct(floor, 95),
            "added_ttft_p50": pct(added, 50)}


def pooled(runs: list[dict[str, Any]], summaries: list[dict[str, Any]],
           direct: dict[str, Any] | None = None) -> dict[str, Any]:
    """One path over repeated rounds (its runs and their summaries, round by round):
    percentiles (ms) over every round's measured requests, sums of cost (USD), CPU (s),
    outcomes, hits, served-wrong and changed requests; ratios to ``direct``, the direct
    path pooled alike."""
    ok = [r for run in runs for r in run["results"] if r.outcome == "ok" and r.ttft_ms]
    ttft, e2e = [r.ttft_ms for r in ok], [r.e2e_ms for r in ok]
    out: dict[str, Any] = {
        "rounds": len(runs), "requests": sum(len(run["results"]) for run in runs),
        "ttft_p50": pct(ttft, 50), "ttft_p95": pct(ttft, 95), "ttft_p99": pct(ttft, 99),
        "e2e_p50": pct(e2e, 50), "e2e_p99": pct(e2e, 99),
        "cost_usd": sum(s["cost_usd"] for s in summaries),
        "cpu_s": sum(s["cpu_s"] for s in summaries),
        "outcomes": dict(sum((Counter(s["outcomes"]) for s in summaries), Counter())),
        "hits": dict(sum((Counter(s["hits"]) for s in summaries), Counter())),
        "served_wrong": sum(s.get("served_wrong") or 0 for s in summaries),
        "meaning_changed": {"changed": sum(s["meaning_changed"]["changed"] for s in summaries
                                           if s.get("meaning_changed"))},
    }
    if direct is not None:
        d = direct
        out["ratios"] = {k: out[k] / d[k] for k in ("ttft_p50", "ttft_p95", "ttft_p99",
                                                     "e2e_p50", "e2e_p99") if out[k] and d[k]}
        if d["cost_usd"]:
            out["ratios"]["cost"] = out["cost_usd"] / d["cost_usd"]
    return out


def gaps(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per round, ``ours`` against ``theirs`` (summaries, round by round) as a relative
    change: -0.15 is 15% lower. Keys: TTFT p50/p95/p99, cost, CPU."""
    out: dict[str, list[float]] = {}
    for key in ("ttft_p50", "ttft_p95", "ttft_p99", "cost_usd", "cpu_s"):
        out[key] = [round(a[key] / b[key] - 1, 4) for a, b in zip(ours, theirs, strict=True)
                    if a.get(key) is not None and b.get(key)]
    return out


def print_report(report: dict[str, Any]) -> None:
    print("provider simulator:", json.dumps(report["sim"], sort_keys=True))
    print("workload:", json.dumps(report["mix"], sort_keys=True))
    print_table(report["paths"])
    for name, s in report["paths"].items():
        lossy = s.get("lossy") or {}
        if lossy.get("rerouted_share") or (lossy.get("retrieval_answer_kept") or 1) < 1:
            print(f"{name}: retrieval gold answer kept {lossy['retrieval_answer_kept']} of "
                  f"{lossy['retrieval_checked']}, sent to another model "
                  f"{lossy['rerouted_share']:.2f}")
    for name, s in report["paths"].items():
        own = s.get("provider") or {}
        if name != "direct" and own.get("floor_ttft_p50") is not None:
            print(f"{name}: TTFT p50 / p95 were the proxy free {own['floor_ttft_p50']:.0f} / "
                  f"{own.get('floor_ttft_p95') or 0:.0f} ms (the provider's own time for what "
                  f"it was sent; 0 for hits), the proxy's median addition "
                  f"{own['added_ttft_p50'] or 0:.1f} ms")
    for without, delta in report.get("stage_shares", {}).items():
        print(f"{without}: " + ", ".join(f"{k} {v:+}" for k, v in delta.items())
              + f" (against {without.split()[0]}; + = it helped)")


def print_table(paths: dict[str, dict[str, Any]]) -> None:
    """One line per path: latency (ms, ratio to direct), cost, hits, wrong, changed, CPU,
    outcomes."""
    head = ("path", "ttft p50", "p95", "p99", "e2e p50", "p99", "cost $", "hits", "wrong",
            "changed", "cpu s", "errors")
    print(" | ".join(head))
    for name, s in paths.items():
        r = s.get("ratios", {})

        def cell(key: str, ratio: str, s: dict[str, Any] = s, r: dict[str, float] = r) -> str:
            v = s.get(key)
            return "-" if v is None else (f"{v:.0f}" + (f" ({r[ratio]:.2f}x)" if ratio in r
                                                     else ""))
        print(" | ".join([
            name, cell("ttft_p50", "ttft_p50"), cell("ttft_p95", "ttft_p95"),
            cell("ttft_p99", "ttft_p99"), cell("e2e_p50", "e2e_p50"), cell("e2e_p99", "e2e_p99"),
            f"{s['cost_usd']:.3f}" + (f" ({r['cost']:.2f}x)" if "cost" in r else ""),
            json.dumps(s["hits"]), str(s["served_wrong"]), str(s["meaning_changed"]["changed"]),
            f"{s['cpu_s']:.1f}", json.dumps(s["outcomes"])]))


def pool_rounds(rounds: list[tuple[dict[str, Any], list[dict[str, Any]]]]
                ) -> dict[str, dict[str, Any]]:
    """Each path over every round (:func:`bench.workload_report.pooled`)."""
    names = list(rounds[0][0]["paths"])
    runs = {n: [next(r for r in raw if r["name"] == n) for _, raw in rounds] for n in names}
    summaries = {n: [report["paths"][n] for report, _ in rounds] for n in names}
    direct = pooled(runs["direct"], summaries["direct"]) if "direct" in runs else None
    return {n: direct if n == "direct" and direct else pooled(runs[n], summaries[n], direct)
            for n in names}


def print_pooled(report: dict[str, Any]) -> None:
    """The pooled table, then each proxy path's per-round change against LiteLLM."""
    print(f"## pooled over {len(report['rounds'])} rounds")
    print_table(report["pooled"])
    for pair, gap in report["gaps"].items():
        print(f"{pair}, per round: " + ", ".join(
            f"{k} " + "/".join(f"{v:+.1%}" for v in vs) for k, vs in gap.items()))
