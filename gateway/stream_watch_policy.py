"""Policy ``[stream_watch]``: the first-token deadline and stall detection of streamed
answers (issue 48, items 1 and 2; what they do: :mod:`gateway.stream_watch`).

::

    [stream_watch]
    first_token_ms = 0              # a fixed deadline (ms); 0: none
    first_token_percentile = 0.95   # the learned one: this percentile of the target's
    first_token_factor = 1.5        #   recent first-token times (of requests near in
    first_token_floor_ms = 1000     #   size), times this (0: none), never under this,
    first_token_min_samples = 50    #   once the target has this many samples
    stream_idle_timeout_ms = 60000  # once the answer streams: longest silence (pings and
                                    #   comments are silence); 0: none
    min_tokens_per_s = 0            # a minimum pace over pace_window_s; 0: none
    pace_window_s = 10
    max_continuations = 2           # continuations of a broken stream a request may make
    continue_upstreams = []         # OpenAI-compatible upstreams taking continue_final_message
    prefill_models = ["claude-3*", ...]  # Anthropic models taking an assistant prefill
    equivalent_models = []          # groups of upstream model ids one may continue another's

    [stream_watch.models."o3-pro"]  # a public model (or a pattern as written): its own
    first_token_factor = 0          #   values, the rest from above
    stream_idle_timeout_ms = 0
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from gateway.schema import bounded

__all__ = ["PREFILL_MODELS", "StreamWatchOverride", "StreamWatchPolicy", "StreamWatchRule"]


@dataclass(frozen=True)
class StreamWatchRule:
    """The values for one model (the section's, or a model's override over them)."""

    #: A fixed first-token deadline (ms) from an attempt's start to its upstream's first
    #: text, tool-call or reasoning delta; 0: none. Off by default: no one number fits
    #: every model (a reasoning model may think for minutes, a 200k-token prompt prefills
    #: for tens of seconds); set it per model where the answer's shape is known.
    first_token_ms: float = bounded(0.0, ge=0.0)
    #: The learned deadline: this percentile (0.5-1) of the first-token times of the 64 of
    #: the target's last 256 samples nearest the request in size... (gateway.ttft_window)
    first_token_percentile: float = bounded(0.95, ge=0.5, le=1.0)
    #: ... times this factor; 0: no learned deadline. 0.95 x 1.5: "The Tail at Scale"
    #: (Dean & Barroso, 2013) re-sends at about the 95th percentile; hosted first tokens
    #: have a heavy tail (a few percent 5-10x the median), which a cut and a fresh attempt
    #: (another machine) escape: about 1-3% of attempts are cut, each one's prompt billed
    #: again (mostly a prompt-cache read by then). One cut a request; a target whose cuts
    #: do not pay (the next attempt as slow: a reasoning model's long thinking) is not cut
    #: for 10 min (gateway.stream_watch.StreamWatch.cut_paid). bench/workload.py --faults
    #: issue48: end-to-end p99 0.72x of direct at 0.99 x 3 (5 s floor), 0.47x so, +0.7% cost.
    first_token_factor: float = bounded(1.5, ge=0.0)
    #: The learned deadline is never shorter (ms): a target whose first tokens all come in
    #: a few hundred ms (the local engine's in tens) is not cut by a hiccup of under a
    #: second, which costs less than the attempt it would start again.
    first_token_floor_ms: float = bounded(1000.0, ge=0.0)
    #: Samples a target needs before its learned deadline applies (a cold target is not cut
    #: on no evidence; with 50, p99 is the slowest seen).
    first_token_min_samples: int = bounded(50, ge=1, le=256)
    #: Once the answer streams (its first delta arrived), the longest silence (ms) between
    #: two upstream events, pings and comments not counting; then the stream is an upstream
    #: failure (0: none). Half the hosted read timeout (120 s), which was the only bound
    #: before (and none while an upstream sends pings); far above any gap mid-answer but a
    #: reasoning model thinking between two summary parts (tens of seconds).
    stream_idle_timeout_ms: float = bounded(60_000.0, ge=0.0)
    #: A minimum pace once the answer streams: fewer content events (about a token each on
    #: OpenAI-compatible servers, a few on Anthropic: an undercount, so never too strict)
    #: per second of upstream time over ``pace_window_s`` is a stall; 0: none (default: a
    #: slow answer is still an answer; for long answers behind a client's own timeout).
    min_tokens_per_s: float = bounded(0.0, ge=0.0)
    pace_window_s: float = bounded(10.0, ge=0.1)
    #: Continuations (gateway.continuation) a request may make after its stream broke,
    #: stalled or sent an error event once answering, where a target can continue the text
    #: (0: none). 2: a second failure in a row is rare (faults of a few percent), a third
    #: most likely a request that breaks its upstreams, whose retries only add load; each
    #: one also spends a retry-budget token.
    max_continuations: int = bounded(2, ge=0, le=10)


#: Anthropic models that take an assistant prefill (fnmatch patterns on the upstream's
#: model id): Claude 3.x and 4 to 4.5. Claude 4.6 and later refuse one (a 400); an unknown
#: model is not continued (a refusal would cost a request, then end as an error anyway).
PREFILL_MODELS = ("claude-3*", "claude-*-4-[0-5]", "claude-*-4-[0-5]-*", "claude-*-4-2*",
                  "claude-*-4")


@dataclass(frozen=True)
class StreamWatchOverride:
    """A model's own values; each unset one is the section's."""

    first_token_ms: float | None = bounded(None, ge=0.0)
    first_token_percentile: float | None = bounded(None, ge=0.5, le=1.0)
    first_token_factor: float | None = bounded(None, ge=0.0)
    first_token_floor_ms: float | None = bounded(None, ge=0.0)
    first_token_min_samples: int | None = bounded(None, ge=1, le=256)
    stream_idle_timeout_ms: float | None = bounded(None, ge=0.0)
    min_tokens_per_s: float | None = bounded(None, ge=0.0)
    pace_window_s: float | None = bounded(None, ge=0.1)
    max_continuations: int | None = bounded(None, ge=0, le=10)


@dataclass(frozen=True)
class StreamWatchPolicy(StreamWatchRule):
    #: Public model name, or a model pattern as written (shared by the ids it serves; an
    #: id named on its own has its own) -> its own values.
    models: dict[str, StreamWatchOverride] = field(default_factory=dict)
    #: OpenAI-compatible upstreams (names) that continue a final assistant message given
    #: ``continue_final_message: true``, ``add_generation_prompt: false`` (vLLM, SGLang).
    #: None by default: a server that ignores the flag answers anew, and the client would
    #: read the text twice. (OpenAI's hosted models cannot continue.)
    continue_upstreams: tuple[str, ...] = ()
    #: Anthropic upstream model ids (patterns) that take an assistant prefill.
    prefill_models: tuple[str, ...] = PREFILL_MODELS
    #: Groups of upstream model ids that may continue each other's text (by default only
    #: the same model id does: another model would not write the same answer).
    equivalent_models: tuple[tuple[str, ...], ...] = ()

    def rule(self, key: str | None) -> StreamWatchRule:
        """The values for the model keyed ``key`` (gateway.models.model_key): the section
        itself, or the model's override over it (made once per policy snapshot)."""
        if key is None or not self.models or (override := self.models.get(key)) is None:
            return self
        made: dict[str, StreamWatchRule] = self.__dict__.setdefault("_rules", {})
        rule = made.get(key)
        if rule is None:
            base = StreamWatchRule(**{f.name: getattr(self, f.name)
                                      for f in fields(StreamWatchRule)})
            rule = made[key] = replace(base, **{
                f.name: v for f in fields(override) if (v := getattr(override, f.name))
                is not None})
        return rule
