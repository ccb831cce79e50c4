"""deploy/compose.yaml against the compose specification's JSON schema (as check-jsonschema
vendors it, for offline use), what it mounts, and the Grafana provisioning and dashboard it
serves."""

from __future__ import annotations

import json
import tomllib
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.promql import DASHBOARD, ROOT

DEPLOY = ROOT / "deploy"


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return doc


def compose_errors(doc: dict[str, Any]) -> list[str]:
    schema = json.loads(files("check_jsonschema.builtin_schemas.vendor")
                        .joinpath("compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator(schema, format_checker=validator.FORMAT_CHECKER)
            .iter_errors(doc)]


def test_compose_file_follows_the_compose_specification() -> None:
    assert compose_errors(compose()) == []


def test_the_schema_check_rejects_a_misspelt_key() -> None:
    doc = compose()
    doc["services"]["gateway"]["helthcheck"] = doc["services"]["gateway"].pop("healthcheck")
    assert any("helthcheck" in e for e in compose_errors(doc))


def test_it_runs_the_four_services_from_files_that_exist() -> None:
    doc = compose()
    assert set(doc["services"]) == {"gateway", "redis", "prometheus", "grafana"}
    build = doc["services"]["gateway"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).is_file()
    for name, service in doc["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source}"


def test_the_gateway_reads_the_config_and_policy_where_compose_mounts_them() -> None:
    gateway = compose()["services"]["gateway"]
    mounts = {target: DEPLOY / source for source, target, *_ in
              (v.split(":") for v in gateway["volumes"])}
    config_path = Path(gateway["command"][gateway["command"].index("--config") + 1])
    config = tomllib.loads((mounts[str(config_path.parent)] / config_path.name).read_text())
    policy = Path(config["server"]["policy"])
    assert (mounts[str(policy.parent)] / policy.name).is_file()
    host, port = config["cache"]["redis_url"].removeprefix("redis://").split("/")[0].split(":")
    assert host == "redis" and port == "6379"
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    [job] = prometheus["scrape_configs"]
    assert job["static_configs"][0]["targets"] == [f"gateway:{config['server']['port']}"]


def test_grafana_gets_the_datasource_and_the_dashboard() -> None:
    grafana = compose()["services"]["grafana"]
    mounts = {target: DEPLOY / source for source, target, *_ in
              (v.split(":") for v in grafana["volumes"])}
    provisioning = mounts["/etc/grafana/provisioning"]
    [source] = yaml.safe_load(
        (provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    [provider] = yaml.safe_load(
        (provisioning / "dashboards" / "llm-gateway.yml").read_text())["providers"]
    assert (mounts[provider["options"]["path"]] / DASHBOARD.name).samefile(DASHBOARD)


def test_dashboard_panels_are_laid_out_and_use_the_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
    titles = " / ".join(p["title"] for p in panels)
    for subject in ("Errors by type", "Time to first token", "Gateway overhead",
                    "Cache lookups by result and layer", "Route decisions", "Shed by reason",
                    "Circuit breakers", "Engine sequences", "KV cache use", "Engine TTFT",
                    "Cached input share", "Compression outcomes"):
        assert subject in titles


@pytest.mark.parametrize("name", ["compose.yaml", "prometheus/prometheus.yml",
                                  "prometheus/alerts.yml", "prometheus/alerts_test.yml"])
def test_yaml_files_parse(name: str) -> None:
    assert yaml.safe_load((DEPLOY / name).read_text())
