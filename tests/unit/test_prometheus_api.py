"""The one Prometheus HTTP API client, against a stub that answers as Prometheus does."""

import json
import threading
import urllib.error
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdserve.cluster.prometheus import PrometheusAPI, Series

RESULT = [
    {"metric": {"model_name": "a", "pool": "decode"}, "value": [1.0, "2.5"]},
    {"metric": {"model_name": "b", "pool": "prefill"}, "value": [1.0, "NaN"]},
    {"metric": {}, "value": [1.0, "7"]},
]
NAMES = ["ray_pdserve_prompt_tokens_total", "up"]
# Evaluated at 100.0, the newest samples at 97.5 and 40.0: Prometheus' clock, both.
AGES_QUERY = "max by (model_name, pool) (timestamp(up))"
AGES = [
    {"metric": {"model_name": "a", "pool": "decode"}, "value": [100.0, "97.5"]},
    {"metric": {"model_name": "a", "pool": "prefill"}, "value": [100.0, "40"]},
]


class _Stub(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query).get("query", [""])[0]
        if url.path == "/api/v1/label/__name__/values":
            status, body = 200, {"status": "success", "data": NAMES}
        elif query == AGES_QUERY:
            status, body = 200, {"status": "success", "data": {"result": AGES}}
        elif query == "bad(":
            status, body = 400, {"status": "error", "error": "parse error"}
        elif query == "refused":
            status, body = 200, {"status": "error", "error": "refused"}
        else:
            status, body = 200, {"status": "success", "data": {"result": RESULT}}
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def api() -> Iterator[PrometheusAPI]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield PrometheusAPI(f"http://127.0.0.1:{server.server_address[1]}/")
    server.shutdown()
    server.server_close()


def test_a_query_gives_each_series_labels_and_value(api: PrometheusAPI) -> None:
    series = api.query("up")
    assert series[0] == Series({"model_name": "a", "pool": "decode"}, 2.5, 1.0)
    assert len(series) == 3 and series[1].value != series[1].value  # NaN kept here


def test_values_by_label_leave_nan_out(api: PrometheusAPI) -> None:
    assert api.by_label("up", "model_name") == {"a": 2.5, "": 7.0}
    assert api.by_label("up", "pool") == {"decode": 2.5, "": 7.0}


def test_sample_ages_are_read_on_prometheus_clock_alone(api: PrometheusAPI) -> None:
    ages = api.sample_ages("up", ("model_name", "pool"))
    assert ages == {("a", "decode"): 2.5, ("a", "prefill"): 60.0}


def test_metric_names(api: PrometheusAPI) -> None:
    assert api.metric_names() == set(NAMES)


def test_a_refused_query_raises(api: PrometheusAPI) -> None:
    with pytest.raises(urllib.error.HTTPError):
        api.query("bad(")
    with pytest.raises(RuntimeError, match="refused"):
        api.query("refused")
