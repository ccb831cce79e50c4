"""Model families in the config and the model table: what loads, what is refused (naming
the key), which entry serves an id, how per-model policy keys apply to an id a pattern
resolved, and `gateway check`'s warning about overlapping patterns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import load_config
from gateway.errors import ConfigError, ModelNotFound
from gateway.models import ModelTable, model_key
from gateway.policy import load_policy
from gateway.routing.decision import Routers
from gateway.state import check_policy

UPSTREAMS = """
[server]
policy = "policy.toml"
[upstreams.up]
type = "openai"
base_url = "http://127.0.0.1:1/v1"
[upstreams.claude]
type = "anthropic"
"""

FAMILIES = UPSTREAMS + """
[models."claude-opus-4-1"]
targets = [{ upstream = "claude", model = "claude-opus-4-1-20250805" }]
aliases = ["opus"]
[models."*"]
targets = [{ upstream = "up", model = "catch-all" }]
[models."claude-*"]
targets = [{ upstream = "claude" }, { upstream = "up", model = "backup-{1}" }]
list = ["claude-sonnet-4-5", "claude-opus-4-5"]
[models."claude-haiku-*"]
targets = [{ upstream = "claude", model = "{model}" }, { upstream = "up", model = "small" }]
[models."anthropic/*"]
targets = [{ upstream = "claude", model = "{1}" }]
[models."*-latest"]
targets = [{ upstream = "up", model = "{model}" }]
"""


def write(tmp_path: Path, config: str, policy: str = "") -> Path:
    (tmp_path / "policy.toml").write_text(policy)
    path = tmp_path / "gateway.toml"
    path.write_text(config)
    return path


@pytest.fixture
def table(tmp_path: Path) -> ModelTable:
    return ModelTable(load_config(write(tmp_path, FAMILIES)))


def served(table: ModelTable, model: str) -> tuple[str | None, list[tuple[str, str]]]:
    route = table.resolve(model)
    return route.pattern, [(t.upstream, t.model) for t in route.targets]


def test_an_exact_name_or_alias_wins_over_every_pattern(table):
    assert served(table, "claude-opus-4-1") == (None, [("claude", "claude-opus-4-1-20250805")])
    assert table.resolve("opus").name == "claude-opus-4-1"


def test_an_id_goes_to_the_most_literal_pattern_with_its_id_passed_through(table):
    assert served(table, "claude-sonnet-4-5-20250929") == (
        "claude-*", [("claude", "claude-sonnet-4-5-20250929"),
                     ("up", "backup-sonnet-4-5-20250929")])
    assert served(table, "claude-haiku-4-5") == (
        "claude-haiku-*", [("claude", "claude-haiku-4-5"), ("up", "small")])
    assert served(table, "anthropic/claude-x") == ("anthropic/*", [("claude", "claude-x")])
    assert served(table, "gpt-5-codex") == ("*", [("up", "catch-all")])
    # "claude-*" and "*-latest" have 7 literal characters each: the one written first
    assert served(table, "claude-latest")[0] == "claude-*"
    assert table.resolve("claude-haiku-4-5").name == "claude-haiku-4-5"  # the id, as asked


def test_nothing_serves_an_id_no_entry_matches(tmp_path):
    table = ModelTable(load_config(write(tmp_path, UPSTREAMS + """
[models."claude-*"]
targets = [{ upstream = "claude" }]
""")))
    assert table.get("gpt-4o") is None
    assert table.get("claude-*") is None  # a "*" is never part of an id
    with pytest.raises(ModelNotFound):
        table.resolve("gemini-2.5-pro")


def test_v1_models_lists_exact_names_aliases_and_each_patterns_list(table):
    assert table.public() == ["claude-opus-4-1", "opus", "claude-sonnet-4-5",
                              "claude-opus-4-5"]


def test_metric_labels_are_the_configs_models_and_the_patterns_names(table):
    assert set(table.metric_models()) == {
        "claude-opus-4-1-20250805", "catch-all", "small", "claude-*", "claude-haiku-*",
        "anthropic/*", "*-latest", "*"}


def test_a_policy_key_names_an_id_of_a_family_or_the_family(table):
    haiku, sonnet = table.resolve("claude-haiku-4-5"), table.resolve("claude-sonnet-4-5")
    listed = {"claude-haiku-4-5": 1, "claude-*": 4}
    assert model_key("claude-haiku-4-5", haiku, listed) == "claude-haiku-4-5"
    assert model_key("claude-sonnet-4-5", sonnet, listed) == "claude-*"
    assert model_key("claude-sonnet-4-5", sonnet) == "claude-*"  # learned state: bounded
    exact = table.resolve("claude-opus-4-1")
    assert model_key("claude-opus-4-1", exact, listed) == "claude-opus-4-1"
    assert model_key("auto", None, listed) == "auto"  # a router alias: no route yet


def test_a_policy_may_name_patterns_and_ids_they_match(tmp_path):
    path = write(tmp_path, FAMILIES, """
[rate_limits.default]
models = { "claude-*" = { requests_per_minute = 5 }, "claude-haiku-4-5" = { requests_per_minute = 1 } }
[routing.tiers]
small = ["claude-haiku-4-5"]
large = ["claude-opus-4-1"]
[routing.routers.auto]
models = ["claude-*"]
""")
    config = load_config(path)
    check_policy(load_policy(config.policy_path), ModelTable(config), Routers())


@pytest.mark.parametrize(("policy", "message"), [
    (('[routing.tiers]\nsmall = ["claude-*"]\nlarge = ["opus"]\n'
     '[routing.routers.auto]\nweak = "small"\nstrong = "large"\n'),
     "routing.tiers.small: the model 'claude-*' is not configured"),
    ('[rate_limits.default]\nmodels = { "gemini-*" = { requests_per_minute = 1 } }\n',
     "the model 'gemini-*' is not configured"),
])
def test_a_policy_naming_what_no_entry_serves_is_refused(tmp_path, policy, message):
    config = load_config(write(tmp_path, UPSTREAMS + """
[models."claude-*"]
targets = [{ upstream = "claude" }]
[models.opus]
targets = [{ upstream = "claude", model = "claude-opus-4-1" }]
""", policy))
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        check_policy(load_policy(config.policy_path), ModelTable(config), Routers())


def test_a_router_name_a_pattern_matches_is_allowed(tmp_path):
    """The endpoint tries a router's name before the patterns (never before an exact
    name)."""
    config = load_config(write(tmp_path, UPSTREAMS + """
[models."*"]
targets = [{ upstream = "up" }]
[models.small]
targets = [{ upstream = "up", model = "s" }]
""", '[routing.tiers]\nsmall = ["small"]\nlarge = ["gpt-5"]\n[routing.routers.auto]\n'))
    check_policy(load_policy(config.policy_path), ModelTable(config), Routers())


@pytest.mark.parametrize(("models", "key", "message"), [
    ('[models."claude-*"]\ntargets = [{ upstream = "claude", model = "{2}" }]',
     "models.claude-*.targets[0].model", "unknown placeholder {2}"),
    ('[models."claude-*"]\ntargets = [{ upstream = "claude", model = "x{" }]',
     "models.claude-*.targets[0].model", "a lone '{' or '}'"),
    ('[models.m]\ntargets = [{ upstream = "up" }]',
     "models.m.targets[0].model", "only a pattern entry passes the client's id through"),
    ('[models.m]\ntargets = [{ upstream = "up", model = "{model}" }]',
     "models.m.targets[0].model", "under a pattern entry only"),
    ('[models."claude-*"]\ntargets = [{ upstream = "claude" }]\naliases = ["c"]',
     "models.claude-*.aliases", "a pattern entry takes no aliases"),
    ('[models.m]\ntargets = [{ upstream = "up", model = "x" }]\nlist = ["m2"]',
     "models.m.list", "only a pattern entry"),
    ('[models.m]\ntargets = [{ upstream = "up", model = "x" }]\naliases = ["m-*"]',
     "models.m.aliases", "an alias is an exact name"),
    ('[models."claude-**"]\ntargets = [{ upstream = "claude" }]',
     "models.claude-**", "two adjacent '*'"),
    ('[models."claude-*"]\ntargets = [{ upstream = "claude" }]\nlist = ["gpt-4o"]',
     "models.claude-*.list[0]", ("'gpt-4o' would not be served by this entry: it does not "
                                "match the pattern")),
    (('[models."claude-*"]\ntargets = [{ upstream = "claude" }]\nlist = ["claude-haiku-4"]\n'
     '[models."claude-haiku-*"]\ntargets = [{ upstream = "claude" }]'),
     "models.claude-*.list[0]", "it is served by 'claude-haiku-*', which comes first"),
    ('[models."claude-*"]\ntargets = [{ upstream = "nowhere" }]',
     "models.claude-*.targets[0].upstream", "unknown upstream 'nowhere'"),
])
def test_a_bad_model_entry_is_refused_naming_its_key(tmp_path, models, key, message):
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, UPSTREAMS + models + "\n"))
    assert caught.value.key == key
    assert message in str(caught.value)


def test_gateway_check_warns_about_patterns_that_overlap(tmp_path, capsys):
    assert main(["check", str(write(tmp_path, FAMILIES))]) == 0
    out = capsys.readouterr()
    warnings = out.err.splitlines()
    assert ("warning: {}: models: the patterns 'claude-haiku-*' and 'claude-*' overlap (both "
            "match e.g. 'claude-haiku-x'): 'claude-haiku-*' serves such ids (more literal "
            "characters, or written first)").format(tmp_path / "gateway.toml") in warnings
    # of the 10 pairs, all but anthropic/* with claude-* and with claude-haiku-*
    assert len(warnings) == 8
    assert "ok:" in out.out


def test_gateway_check_says_nothing_of_patterns_that_cannot_meet(tmp_path, capsys):
    assert main(["check", str(write(tmp_path, UPSTREAMS + """
[models."claude-*"]
targets = [{ upstream = "claude" }]
[models."gpt-*"]
targets = [{ upstream = "up" }]
"""))]) == 0
    assert capsys.readouterr().err == ""


def test_the_example_configs_families_load_once_uncommented(tmp_path):
    root = Path(__file__).resolve().parents[2]
    text = (root / "gateway.example.toml").read_text()
    block = text[text.index("# Families by pattern"):]
    lines = [line[2:] for line in block.splitlines()
             if re.match(r"# (\[|\w+ = )", line)]
    config = text.replace('"policies/default.toml"', '"policy.toml"') + "\n".join(lines)
    table = ModelTable(load_config(write(tmp_path, config)))
    assert served(table, "claude-haiku-4-5") == ("claude-*", [("anthropic", "claude-haiku-4-5")])
    assert served(table, "anthropic/claude-opus-4-1") == (
        "anthropic/*", [("anthropic", "claude-opus-4-1")])
    assert served(table, "gpt-5.1-codex") == ("gpt-5*", [("openai", "gpt-5.1-codex")])
