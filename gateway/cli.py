"""``gateway`` command line: serve, check, and the tools of later stages.

    gateway serve [--config FILE] [--host H] [--port P]
    gateway check FILE
    gateway engine [--model smollm2] [--port 8081] ...   (the local engine alone)
    gateway replay FILE [--base-url URL] [--concurrency N] ...
    gateway cache calibrate|eval|purge|train ...
    gateway route eval|train ...
    gateway prompt-cache report LOG [--json] ...
    gateway report LOG... [--out FILE.html] [--json] [--prices FILE]

The last five are offline tools (:mod:`gateway.tools`): only the one a command line names is
imported, so ``gateway serve`` never loads them.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import math
import sys
from collections.abc import Sequence
from types import FrameType

from gateway.auth import Authenticator
from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.model_patterns import overlap
from gateway.models import ModelTable
from gateway.policy import load_policy
from gateway.routing.decision import Routers
from gateway.state import check_policy

__all__ = ["main"]


def _serve(args: argparse.Namespace) -> int:
    import structlog
    import uvicorn

    from gateway.app import create_app
    from gateway.connection_limits import ConnectionLimits
    from gateway.requestlog import configure_logging
    from gateway.serving import server_protocol

    config = load_config(args.config)
    configure_logging(config.logging.level)
    limits = ConnectionLimits.of(config.server)
    warning = limits.descriptor_warning()
    if warning is not None:
        structlog.get_logger("gateway.serve").warning("connection_limit", message=warning)
    app = create_app(config)
    # Start-up objects (config, libraries, metric families) never die: keep them out of the
    # cyclic GC's way, and collect young objects less often (the request path allocates a
    # lot of short-lived, acyclic garbage).
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    drain_s = config.server.drain_timeout_s

    class Server(uvicorn.Server):
        """uvicorn, draining first on SIGTERM/SIGINT (gateway.drain): /readyz turns 503,
        new requests are refused, requests in flight get until the drain deadline."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            app.gateway.drain.begin_threadsafe(drain_s)
            super().handle_exit(sig, frame)

    Server(uvicorn.Config(
        app,
        host=args.host or config.server.host,
        port=args.port if args.port is not None else config.server.port,
        loop="uvloop",
        # The door's limits (header size and time, body and send time, connection caps)
        # and the keep-alive wait are the protocol's: gateway.connections.
        http=server_protocol(limits),
        access_log=False,
        proxy_headers=False,
        server_header=False,
        log_level="warning",
        lifespan="on",
        # Past the drain deadline every request has ended; this only bounds the rest.
        timeout_graceful_shutdown=math.ceil(drain_s) + 1,
    )).run()
    return 0


def _check(args: argparse.Namespace) -> int:
    config = load_config(args.config)  # templates and listed ids included
    policy = load_policy(config.policy_path)
    Authenticator(config.auth, source=config.path)  # key variables must be set
    models = ModelTable(config)
    try:  # stages that exist, models of this config, router artifacts that load
        check_policy(policy, models, Routers())
    except ValueError as exc:
        raise ConfigError(str(config.policy_path), "", str(exc)) from exc
    for warning in _overlaps(models):
        print(f"warning: {args.config}: {warning}", file=sys.stderr)
    print(f"ok: {args.config}: {len(config.upstreams)} upstream(s), {len(config.models)} "
          f"model(s); policy {config.policy_path} (version {policy.version!r})")
    return 0


def _overlaps(models: ModelTable) -> list[str]:
    """A line per pair of patterns that can match one id: which one serves it."""
    found = []
    patterns = [f.pattern for f in models.families]  # in precedence order
    for i, first in enumerate(patterns):
        for second in patterns[i + 1:]:
            example = overlap(first, second)
            if example is not None:
                found.append(f"models: the patterns {first.text!r} and {second.text!r} "
                             f"overlap (both match e.g. {example!r}): {first.text!r} serves "
                             "such ids (more literal characters, or written first)")
    return found


def _engine(args: argparse.Namespace) -> int:
    from local_engine.server import serve

    return serve(args)


# Offline tool commands: name -> (module whose ``add_arguments(parser)`` fills the parser, help).
_TOOLS = {
    "replay": ("gateway.tools.replay",
               "replay JSONL conversations and report TTFT/TPOT/latency"),
    "cache": ("gateway.tools.cache_cli", "calibrate, evaluate or purge the semantic cache"),
    "route": ("gateway.tools.route_cli", "audit or retrain the difficulty router"),
    "prompt-cache": ("gateway.tools.prompt_cache_report",
                     "report the providers' prompt-cache reads, writes and savings from a log"),
    "report": ("gateway.tools.report",
               "a dashboard page (HTML, inline plots) or JSON aggregates from request logs"),
}


def _command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: the top-level parser takes no option with a value, so it
    is the first positional."""
    return next((a for a in argv if not a.startswith("-")), None)


def _add_tools(sub: argparse._SubParsersAction[argparse.ArgumentParser],
               argv: Sequence[str]) -> None:
    """Register the tool commands; import and fill in only the one ``argv`` names."""
    command = _command(argv)
    for name, (module, help_) in _TOOLS.items():
        parser = sub.add_parser(name, help=help_)
        if name == command:
            importlib.import_module(module).add_arguments(parser)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the gateway")
    serve.add_argument("--config", default="gateway.example.toml")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.set_defaults(func=_serve)
    check = sub.add_parser("check", help="validate a config file and its policy, then exit")
    check.add_argument("config")
    check.set_defaults(func=_check)
    engine = sub.add_parser("engine", help="serve the local engine alone (OpenAI API)")
    engine.set_defaults(func=_engine)
    args_in = sys.argv[1:] if argv is None else argv
    if _command(args_in) == "engine":  # torch is imported by this command only
        from local_engine.server import add_arguments

        add_arguments(engine)
    if argv is None and _command(args_in) in _TOOLS:
        # A tool's stdout is its output (often JSON): its logs go to stderr. (Only as a
        # process of its own: called in-process, the caller's logging stays as it was.)
        import structlog

        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    _add_tools(sub, args_in)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
