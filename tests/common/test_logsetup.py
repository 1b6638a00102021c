"""Log lines: one text format, or one JSON object per line, for the app and gunicorn's error and access logs alike."""

from __future__ import annotations

import datetime
import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from gunicorn.config import Config

from common import logsetup
from tests.harness.pods import container, pod, review
from tests.harness.webhook.server import webhook_server
from webhook.server.serve import GunicornLogger

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) \[\d+\] [\w.]+: ")


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """Where the test's configure() writes; the root logger is put back afterwards."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    out = io.StringIO()
    yield out
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_json_lines_carry_the_record_and_its_exception(stream: io.StringIO) -> None:
    logsetup.configure("INFO", "json", stream)
    log = logging.getLogger("webhook.server.app")
    log.info("mutate %s uid=%s", "team/pod", "u-1")
    try:
        raise ValueError("broken\nover two lines")
    except ValueError:
        log.exception("validate %s failed", "team/pod")
    log.debug("not shown at INFO")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "mutate team/pod uid=u-1" and first["level"] == "INFO"
    assert first["logger"] == "webhook.server.app" and isinstance(first["pid"], int)
    assert datetime.datetime.fromisoformat(first["time"]).tzinfo is not None
    assert second["level"] == "ERROR" and "ValueError: broken" in second["exception"]


def test_text_lines_have_one_format(stream: io.StringIO) -> None:
    logsetup.configure("DEBUG", "text", stream)
    logging.getLogger("deviceplugin.main").debug("registered %s", "aliyun.com/gpu-mem")
    (line,) = stream.getvalue().splitlines()
    assert TEXT_LINE.match(line), line
    assert line.endswith("deviceplugin.main: registered aliyun.com/gpu-mem")


def test_urllib3_retry_warnings_are_silenced(stream: io.StringIO) -> None:
    logsetup.configure("INFO", "text", stream)
    logging.getLogger("urllib3.connectionpool").warning("Retrying (Retry(total=2)) after connection broken")
    assert stream.getvalue() == ""


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_gunicorn_access_lines_go_through_the_same_handler(stream: io.StringIO, log_format: str) -> None:
    logsetup.configure("INFO", log_format, stream)
    cfg = Config()
    cfg.set("accesslog", "-")
    logger = GunicornLogger(cfg)
    environ = {"REQUEST_METHOD": "POST", "RAW_URI": "/mutate", "PATH_INFO": "/mutate", "QUERY_STRING": "",
               "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "10.0.0.7", "HTTP_USER_AGENT": "kube-apiserver"}
    resp = SimpleNamespace(status="200 OK", sent=512, headers=[("Content-Type", "application/json")])
    logger.access(resp, SimpleNamespace(headers=[]), environ, datetime.timedelta(milliseconds=3))
    logger.info("Booting worker with pid: %s", 42)
    access, error = stream.getvalue().splitlines()
    if log_format == "json":
        record = json.loads(access)
        assert record["logger"] == "gunicorn.access"
        assert (record["method"], record["path"], record["status"], record["bytes"]) == ("POST", "/mutate", 200, 512)
        assert record["duration_seconds"] == 0.003 and record["remote"] == "10.0.0.7"
        assert json.loads(error)["message"] == "Booting worker with pid: 42"
    else:
        assert TEXT_LINE.match(access) and TEXT_LINE.match(error)
        assert 'gunicorn.access: 10.0.0.7 "POST /mutate HTTP/1.1" 200 512 0.003000s' in access


@pytest.mark.timeout(90)
@pytest.mark.parametrize("log_format", ["json", "text"])
def test_the_running_webhook_writes_one_format(tmp_path: Path, log_format: str) -> None:
    with webhook_server(tmp_path, {"GPUSHARE_LOG_FORMAT": log_format, "GPUSHARE_WORKERS": "1"}) as hook:
        status, _ = hook.post_json("/mutate", review("CREATE", pod(container("main", 2))))
        assert status == 200
        assert hook.request("POST", "/mutate", b"not json")[0] == 400
    lines = [line for line in hook.log_text().splitlines() if line]
    loggers = set()
    for line in lines:
        if log_format == "json":
            record = json.loads(line)
            assert {"time", "level", "logger", "pid", "message"} <= set(record)
            loggers.add(record["logger"])
        else:
            assert TEXT_LINE.match(line), line
            loggers.add(line.split("] ", 1)[1].split(":", 1)[0])
    assert {"gunicorn.error", "webhook.server.app"} <= loggers


FORGED = "u-1\n2026-01-02T03:04:05.678Z INFO [1] webhook.server.app: validate ml/pod uid=u-2 UPDATE allowed"


def test_a_text_line_cannot_be_forged_through_a_logged_value(stream: io.StringIO) -> None:
    """A review uid or a pod name with a line break or an escape sequence stays on its record's line, escaped."""
    logsetup.configure("INFO", "text", stream)
    log = logging.getLogger("webhook.server.app")
    log.info("mutate %s uid=%s CREATE", "ml/p\r\x1b[2Kq\u2028r\x85", FORGED)
    (line,) = stream.getvalue().splitlines()
    assert TEXT_LINE.match(line), line
    assert all(c.isprintable() for c in line), line
    assert line.endswith("webhook.server.app: mutate ml/p\\r\\x1b[2Kq\\u2028r\\x85 uid=u-1\\n2026-01-02T03:04:05.678Z "
                         "INFO [1] webhook.server.app: validate ml/pod uid=u-2 UPDATE allowed CREATE")


def test_a_traceback_follows_its_record_on_indented_lines(stream: io.StringIO) -> None:
    logsetup.configure("INFO", "text", stream)
    try:
        raise ValueError(f"bad uid {FORGED}\r\x1b[1A")
    except ValueError:
        logging.getLogger("webhook.server.app").exception("mutate ml/p uid=%s failed", "u-1")
    first, *rest = stream.getvalue().rstrip("\n").split("\n")
    assert TEXT_LINE.match(first) and first.endswith("mutate ml/p uid=u-1 failed")
    # Only a record's own line starts at column 0; the exception's forged "record" is an indented line of its traceback.
    assert rest and all(line.startswith(logsetup.CONTINUATION) and not TEXT_LINE.match(line) for line in rest), rest
    assert all(c.isprintable() for line in rest for c in line), rest
    assert rest[0].strip() == "Traceback (most recent call last):"
    assert rest[-1].strip() == "2026-01-02T03:04:05.678Z INFO [1] webhook.server.app: validate ml/pod uid=u-2 UPDATE " \
                               "allowed\\r\\x1b[1A"


def test_a_json_line_escapes_what_ends_a_line_elsewhere(stream: io.StringIO) -> None:
    """JSON escapes C0 controls by itself; C1 controls, DEL and U+2028/U+2029 it would write raw."""
    logsetup.configure("INFO", "json", stream)
    logging.getLogger("webhook.server.app").info("mutate %s uid=%s", "ml/p\x85\u2028\u2029\x9b2J\x7f", FORGED)
    text = stream.getvalue()
    assert text.count("\n") == 1 and all(c.isprintable() for c in text.rstrip("\n")), repr(text)
    assert json.loads(text)["message"] == f"mutate ml/p\x85\u2028\u2029\x9b2J\x7f uid={FORGED}"
