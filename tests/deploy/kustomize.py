"""A small, strict ``kustomize build`` in Python, for the deploy tests.

Debian 12 ships no kustomize, and its kubernetes-client (kubectl 1.20) embeds kustomize
v2, which predates the ``patches`` field; so the tests render ``deploy/k8s`` themselves and
validate that. Only what ``deploy/k8s`` uses is implemented, and any other kustomization
field is an error rather than silently ignored:

- ``resources``: files (YAML streams) and folders holding a kustomization.
- ``configMapGenerator``: ``files`` (``[key=]path``) and ``literals``, ``behavior``
  create/replace/merge, ``options.disableNameSuffixHash``, ``generatorOptions``. The name
  suffix is kustomize's: the first 10 hex digits of the SHA-256 of
  ``{"data": ..., "kind": "ConfigMap", "name": ""}`` as Go's ``json.Marshal`` writes it,
  with 0, 1, 3, a and e replaced by g, h, k, m and t (kustomize ``api/hasher``; the name is
  empty there in effect); references to the ConfigMap in pod templates are renamed with it.
- ``patches``: strategic merge patches (a file or inline), their target named by the
  patch's own kind and name; lists merge by the Kubernetes patch merge keys below.
- ``images``: ``newName``, ``newTag``, ``digest`` on containers and init containers.

Where a kustomize binary exists (``kubectl kustomize``), test_k8s.py checks that this
renders the same objects.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["render"]

_FIELDS = {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions",
           "patches", "images"}
#: Strategic merge: list fields merged item by item on this key (others are replaced).
_MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name",
               "env": "name", "volumeMounts": "mountPath", "ports": "containerPort",
               "imagePullSecrets": "name", "volumeClaimTemplates": "metadata.name"}
_WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


@dataclass
class _Resource:
    obj: dict[str, Any]
    hashed: bool = False  # a generated ConfigMap whose name gets the content hash


def render(folder: str | Path) -> list[dict[str, Any]]:
    """The objects ``kustomize build folder`` prints (in no particular order). Raises
    ValueError on what this renderer does not implement."""
    resources = _build(Path(folder))
    renames = {}
    for r in resources:
        if r.hashed:
            name = r.obj["metadata"]["name"]
            r.obj["metadata"]["name"] = renames[name] = f"{name}-{config_map_hash(r.obj)}"
    for r in resources:
        if r.obj["kind"] in _WORKLOADS:
            _rename_config_maps(r.obj["spec"]["template"]["spec"], renames)
    return [r.obj for r in resources]


def _build(folder: Path) -> list[_Resource]:
    path = next((folder / n for n in ("kustomization.yaml", "kustomization.yml",
                                      "Kustomization") if (folder / n).exists()), None)
    if path is None:
        raise ValueError(f"{folder}: no kustomization file")
    k = yaml.safe_load(path.read_text())
    unknown = set(k) - _FIELDS
    if unknown:
        raise ValueError(f"{path}: fields this renderer does not implement: {sorted(unknown)}")
    out: list[_Resource] = []
    for entry in k.get("resources", []):
        target = folder / entry
        if target.is_dir():
            out += _build(target)
        else:
            out += [_Resource(doc) for doc in yaml.safe_load_all(target.read_text()) if doc]
    no_hash = bool(k.get("generatorOptions", {}).get("disableNameSuffixHash", False))
    for gen in k.get("configMapGenerator", []):
        _generate(folder, gen, no_hash, out)
    for patch in k.get("patches", []):
        _patch(folder, patch, out)
    for image in k.get("images", []):
        for r in out:
            if r.obj["kind"] in _WORKLOADS:
                _set_image(r.obj["spec"]["template"]["spec"], image)
    return out


def _generate(folder: Path, gen: dict[str, Any], no_hash: bool, out: list[_Resource]) -> None:
    unknown = set(gen) - {"name", "files", "literals", "behavior", "options"}
    if unknown:
        raise ValueError(f"configMapGenerator {gen.get('name')}: unsupported {sorted(unknown)}")
    data: dict[str, str] = {}
    for spec in gen.get("files", []):
        key, _, rel = spec.rpartition("=")
        data[key or Path(rel).name] = (folder / rel).read_text()
    for literal in gen.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    name = gen["name"]
    hashed = not gen.get("options", {}).get("disableNameSuffixHash", no_hash)
    behavior = gen.get("behavior", "create")
    existing = next((r for r in out if r.obj["kind"] == "ConfigMap"
                     and r.obj["metadata"]["name"] == name), None)
    if behavior == "create":
        if existing is not None:
            raise ValueError(f"configMapGenerator {name}: already exists (use behavior)")
        out.append(_Resource({"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": name}, "data": data}, hashed))
    elif existing is None:
        raise ValueError(f"configMapGenerator {name}: behavior {behavior} needs a base one")
    elif behavior in ("replace", "merge"):
        existing.obj["data"] = data if behavior == "replace" else {**existing.obj["data"],
                                                                   **data}
        existing.hashed = hashed
    else:
        raise ValueError(f"configMapGenerator {name}: unknown behavior {behavior!r}")


def _patch(folder: Path, entry: dict[str, Any], out: list[_Resource]) -> None:
    if set(entry) - {"path", "patch"}:
        raise ValueError(f"patch {entry}: only path or patch (strategic merge) is supported")
    patch = yaml.safe_load((folder / entry["path"]).read_text() if "path" in entry
                           else entry["patch"])
    kind, name = patch["kind"], patch["metadata"]["name"]
    matches = [r for r in out if r.obj["kind"] == kind and r.obj["metadata"]["name"] == name]
    if len(matches) != 1:
        raise ValueError(f"patch {entry}: {len(matches)} targets {kind}/{name}")
    matches[0].obj = strategic_merge(matches[0].obj, patch)


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    """``patch`` merged into a copy of ``base``: maps key by key (``null`` deletes), lists
    of the fields in ``_MERGE_KEYS`` item by item, any other value replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = strategic_merge(merged[key], value, key)
            else:
                merged[key] = copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and field in _MERGE_KEYS:
        merged_list = copy.deepcopy(base)
        for item in patch:
            key = _dig(item, _MERGE_KEYS[field])
            at = next((i for i, old in enumerate(merged_list)
                       if _dig(old, _MERGE_KEYS[field]) == key), None)
            if at is None:
                merged_list.append(copy.deepcopy(item))
            else:
                merged_list[at] = strategic_merge(merged_list[at], item)
        return merged_list
    return copy.deepcopy(patch)


def _dig(obj: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj[part]
    return obj


def _set_image(pod: dict[str, Any], image: dict[str, str]) -> None:
    for container in pod.get("initContainers", []) + pod.get("containers", []):
        ref = container["image"]
        name, tag = ref.split("@")[0], ""
        if ":" in name.rsplit("/", 1)[-1]:
            name, tag = name.rsplit(":", 1)
        if name != image["name"]:
            continue
        name = image.get("newName", name)
        if "digest" in image:
            container["image"] = f"{name}@{image['digest']}"
        else:
            tag = image.get("newTag", tag)
            container["image"] = f"{name}:{tag}" if tag else name


def _rename_config_maps(pod: dict[str, Any], renames: dict[str, str]) -> None:
    for volume in pod.get("volumes", []):
        for holder in ([volume.get("configMap")] + [
                s.get("configMap") for s in volume.get("projected", {}).get("sources", [])]):
            if holder and holder.get("name") in renames:
                holder["name"] = renames[holder["name"]]
    for container in pod.get("initContainers", []) + pod.get("containers", []):
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef")
            if ref and ref.get("name") in renames:
                ref["name"] = renames[ref["name"]]
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("configMapKeyRef")
            if ref and ref.get("name") in renames:
                ref["name"] = renames[ref["name"]]


def config_map_hash(obj: dict[str, Any]) -> str:
    """kustomize's name suffix for a ConfigMap (api/hasher: encodeConfigMap, encode)."""
    # "name" is always "": kustomize looks it up as one field named "metadata/name".
    m: dict[str, Any] = {"data": obj.get("data", {}), "kind": "ConfigMap", "name": ""}
    if obj.get("binaryData"):
        m["binaryData"] = obj["binaryData"]
    digest = hashlib.sha256(_go_json(m).encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


_GO_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
               "\u2029": "\\u2029"}


def _go_json(value: Any) -> str:
    """Go's ``json.Marshal`` of maps and strings: keys sorted, no spaces, HTML-safe."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_go_json(k)}:{_go_json(value[k])}" for k in sorted(value)) + "}"
    if isinstance(value, str):
        return '"' + "".join(_GO_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if c < " " else c)
                             for c in value) + '"'
    raise ValueError(f"cannot hash a {type(value).__name__} in a ConfigMap")
