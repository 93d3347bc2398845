"""The Prometheus export on a real server: an EAGLE3_DYNAMIC server started with
``--enable-metrics`` shows the plugin's ``sglang:dynamic_eagle_*`` series on sglang's own
``/metrics`` (written by the scheduler process, merged by the HTTP server through
prometheus_client's multiprocess mode), and they agree with ``/server_info``.

The tiny pair with fixed thresholds of 2 (as the README's demo): four requests of 16-64 new
tokens at once cross them, so both modes and both switches run. ``--decode-log-interval 1``
updates the export at every decode step; it still trails ``/server_info`` by the steps after
the last update, so each counter is checked between 1 and the report's value."""

from __future__ import annotations

import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Mapping

import pytest

from gpu_servers import start_server, stop_server, tiny_pair_args, tiny_pair_server_env, wait_healthy

pytestmark = pytest.mark.gpu

PREFIX = "sglang:dynamic_eagle_"
# Counters both modes and both switches must have moved; the export's full list is
# observability/prometheus_metrics.py's COUNTERS.
MOVED = ("speculative_steps", "plain_steps", "switches_to_plain", "switches_to_speculative")
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")


def exported(metrics_text: str) -> Dict[str, float]:
    """The plugin's series in a /metrics text, by name without the prefix (labels dropped: one
    scheduler, one series per name)."""
    series: Dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match and match["name"].startswith(PREFIX):
            series[match["name"][len(PREFIX):]] = float(match["value"])
    return series


def check_export(series: Mapping[str, float], report: Mapping[str, float]) -> None:
    """Every counter and gauge of the export is there; the counters of both modes moved and
    trail the report; the mode gauge is 0 or 1."""
    from sglang_dynamic_eagle.observability.prometheus_metrics import COUNTERS, GAUGES

    missing = [f"{key}_total" for key in COUNTERS if f"{key}_total" not in series]
    missing += [key for key in (*GAUGES, "speculative_mode") if key not in series]
    assert not missing, f"series missing from /metrics: {missing}; exported: {sorted(series)}"
    for key in MOVED:
        assert 1 <= series[f"{key}_total"] <= report[key], (key, series[f"{key}_total"], report[key])
    assert series["speculative_mode"] in (0.0, 1.0), series["speculative_mode"]
    assert series["mean_accept_length"] > 1.0, series["mean_accept_length"]


def test_an_enable_metrics_server_exports_the_plugins_counters_on_slash_metrics():
    target, draft = tiny_pair_args()
    args = [*target, "--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
            "--speculative-disable-batch-threshold", "2", "--speculative-enable-batch-threshold", "2",
            "--enable-metrics", "--decode-log-interval", "1"]
    server = start_server("tiny_dynamic_metrics", args, tiny_pair_server_env())
    try:
        wait_healthy(server)
        prompt = list(range(10, 42))
        for _ in range(3):
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(lambda n: server.generate(prompt, n), (16, 32, 48, 64)))
        report = server.dynamic_counters()
        with urllib.request.urlopen(server.url + "/metrics", timeout=60) as response:
            series = exported(response.read().decode())
        print({key: series.get(f"{key}_total") for key in MOVED}, {key: report[key] for key in MOVED})
        check_export(series, report)
    finally:
        stop_server(server)
