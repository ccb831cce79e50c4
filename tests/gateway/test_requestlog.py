"""The request log line as operators see it: one JSON object per line on stdout."""

from __future__ import annotations

import subprocess
import sys

import orjson

from gateway.requestlog import FIELDS

SCRIPT = """
from gateway.requestlog import RequestLogger, RequestRecord, configure_logging
configure_logging()
logger = RequestLogger()
rec = RequestRecord("rid-1", "/v1/chat/completions", stream=True)
rec.status = 200
rec.finish()
logger.emit(rec)
logger.flush()
"""


def test_one_json_line_per_request_with_the_documented_schema():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, check=True).stdout
    lines = out.splitlines()
    assert len(lines) == 1
    line = orjson.loads(lines[0])
    assert line["event"] == "request"
    assert set(FIELDS) <= set(line)
    assert line["request_id"] == "rid-1" and line["stream"] is True and line["status"] == 200
    assert line["ts"].endswith("+00:00")


BURST = """
from gateway.requestlog import RequestLogger, RequestRecord
logger = RequestLogger()
for i in range(300):  # about 200 KB: past the buffer's size, so it is written in blocks too
    rec = RequestRecord(f"rid-{i}", "/v1/chat/completions")
    rec.finish()
    logger.emit(rec)
logger.flush()
"""


def test_buffered_lines_come_out_whole_and_in_order_even_with_unbuffered_stdout():
    # The container image sets PYTHONUNBUFFERED=1; the logger batches lines itself.
    env = {"PYTHONUNBUFFERED": "1", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", BURST], capture_output=True, check=True,
                         env=env).stdout
    ids = [orjson.loads(line)["request_id"] for line in out.splitlines()]
    assert ids == [f"rid-{i}" for i in range(300)]
