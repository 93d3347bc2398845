"""The kernel-trace summaries of tools/profile_kernels.py, on synthetic traces and logs."""

from __future__ import annotations

import gzip
import json
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import kernel_profile  # noqa: E402
import profile_kernels  # noqa: E402
from sweeplib import configs  # noqa: E402  (put on the path by profile_kernels)


def kernel(name: str, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


EVENTS = [
    kernel("gemm", 0, 10),
    kernel("gemm", 5, 10),  # overlaps the first: busy time counts it once
    kernel("attention", 30, 5),
    kernel("copy", 40, 2, cat="gpu_memcpy"),
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100},
    {"ph": "i", "cat": "kernel", "name": "marker", "ts": 1},
]

LOG = [
    "[12:00:00] Prefill batch [9], #new-seq: 8, #new-token: 8192, #cached-token: 0",
    "[12:00:01] Profiling starts. Traces will be saved to: /tmp (with profile id: plain)",
    "[12:00:01] Prefill batch [10], #new-seq: 8, #new-token: 4096, #cached-token: 0",
    "[12:00:02] Decode batch [12], #running-req: 64, #token: 9000",
    "[12:00:02] Prefill batch [11], #new-seq: 2, #new-token: 2048, #cached-token: 0",
    "[12:00:03] Stop profiling...",
    "[12:00:03] Profiling done. Traces are saved to: /tmp",
    "[12:00:04] Prefill batch [13], #new-seq: 8, #new-token: 1024, #cached-token: 0",
    "[12:00:04] Prefill batch [14], #new-seq: 8, #new-token: 512, #cached-token: 0",
]


def test_busy_time_is_the_union_of_gpu_events_and_idle_the_rest_of_the_span() -> None:
    summary = kernel_profile.summarise_events(EVENTS)
    assert summary.kernels == 4
    assert summary.busy_us == pytest.approx(15 + 5 + 2)
    assert summary.span_us == pytest.approx(42)
    assert summary.idle_share == pytest.approx(1 - 22 / 42)
    assert summary.by_name_us == {"gemm": 20, "attention": 5, "copy": 2}


def test_prefill_batches_are_counted_by_their_forward_step_not_their_place_in_the_log() -> None:
    # Steps 10-13: batch 13's line comes after the profiler's end lines, batch 9's is outside.
    assert kernel_profile.prefill_in_window(LOG, first_iter=10, steps=4) == (3, 4096 + 2048 + 1024)
    assert kernel_profile.prefill_in_window(LOG, first_iter=20, steps=4) == (0, 0)
    assert kernel_profile.latest_forward_iter(LOG) == 14
    assert kernel_profile.latest_forward_iter(["Prefill batch, #new-token: 5"]) == 0


def test_a_trace_file_and_its_server_log_give_per_token_figures(tmp_path) -> None:
    trace = tmp_path / "plain-TP-0.trace.json.gz"
    with gzip.open(trace, "wt") as out:
        json.dump({"traceEvents": EVENTS}, out)
    log = tmp_path / "server_plain.log"
    log.write_text("\n".join(LOG))
    summary = kernel_profile.summarise_trace(trace, log, first_iter=10, steps=2)
    assert (summary.prefill_batches, summary.prefill_tokens) == (2, 4096 + 2048)
    assert summary.per_token_us(summary.busy_us) == pytest.approx(22 / 6144)
    markdown = kernel_profile.comparison_markdown({"plain": summary, "dynamic": summary}, top=2)
    assert "| GPU busy per prompt token (us) | 0.004 | 0.004 |" in markdown
    assert "`gemm`" in markdown and "`attention`" in markdown and "`copy`" not in markdown


def test_an_empty_trace_summarises_to_zeros() -> None:
    summary = kernel_profile.summarise_events([])
    assert (summary.kernels, summary.busy_us, summary.idle_share) == (0, 0.0, 0.0)
    assert summary.per_token_us(5.0) == 0.0


def test_command_line_defaults_and_server_environment() -> None:
    args = profile_kernels.build_parser().parse_args(["--model-path", "m", "--out", "o"])
    assert (args.configs, args.input_len, args.output_len, args.concurrency, args.profile_steps) == (
        "plain,dynamic", 1024, 2, 64, 40)
    assert configs.parse_env_assignments(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(ValueError, match="NAME=VALUE"):
        configs.parse_env_assignments(["A"])


def test_wait_for_trace_times_out_without_a_file(tmp_path) -> None:
    with pytest.raises(TimeoutError):
        profile_kernels.wait_for_trace(tmp_path / "missing.trace.json.gz", timeout_s=0.1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_profiles_each_configuration_end_to_end_against_a_stand_in_server(tmp_path, monkeypatch) -> None:
    """The whole run on CPU: server start, load, /start_profile by forward step, the trace, the
    prefill lines of the window, the report, and the server stopped."""
    fake = Path(__file__).resolve().parent / "fakes" / "fake_profiled_server.py"

    def fake_command(config, setup):
        return [sys.executable, str(fake), "--port", str(setup.port)]

    monkeypatch.setattr(profile_kernels.configs, "server_command", fake_command)
    monkeypatch.setattr(profile_kernels.server, "HEALTH_POLL_S", 0.1)
    port = free_port()
    out = tmp_path / "out"
    status = profile_kernels.main([
        "--model-path", "unused", "--configs", "plain,dynamic", "--concurrency", "2",
        "--input-len", "4", "--warmup-s", "0.5", "--profile-steps", "5", "--port", str(port),
        "--out", str(out),
    ])
    assert status == 0
    summaries = json.loads((out / "summaries.json").read_text())
    for config in ("plain", "dynamic"):
        assert summaries[config]["kernels"] == 5
        assert summaries[config]["prefill_batches"] == 5
        assert summaries[config]["prefill_tokens"] == 5000
        assert (out / "traces" / f"{config}-TP-0.trace.json.gz").exists()
    markdown = (out / "profile.md").read_text()
    assert "| prompt tokens in the window | 5000 | 5000 |" in markdown
    assert "`fake_gemm`" in markdown
    assert not port_in_use(port)


def traces_shifting(tmp_path, events, name, shifts):
    """One trace file per configuration: ``events`` with those named ``name`` shifted by its
    microseconds."""
    paths = {}
    for config, shift in shifts.items():
        paths[config] = tmp_path / f"{config}.trace.json.gz"
        with gzip.open(paths[config], "wt") as out:
            json.dump({"traceEvents": [dict(e, ts=e["ts"] + shift) if e.get("name") == name else e
                                       for e in events]}, out)
    return paths


def test_idle_before_counts_each_gap_once_by_the_event_that_ends_it(tmp_path):
    # gemm [0, 15) with overlap, idle 15 us before attention [30, 35), 5 us before the copy
    # (not above the 5 us floor), then 18 us before a second attention.
    events = EVENTS + [kernel("attention", 60, 5)]
    assert kernel_profile.idle_before(events) == {"attention": (2, 15.0 + 18.0)}
    # A short event inside a long one leaves the GPU busy until the long one ends.
    nested = [kernel("gemm", 0, 50), kernel("copy", 10, 2), kernel("attention", 60, 5)]
    assert kernel_profile.idle_before(nested) == {"attention": (1, 10.0)}
    assert kernel_profile.idle_before(events, min_gap_us=1.0)["copy"] == (1, 5.0)
    traces = traces_shifting(tmp_path, events, "attention", {"eagle3": 0, "dynamic": 100})
    table = kernel_profile.idle_markdown(traces)
    # Shifted by 100 us, dynamic's copy ends a 25 us gap and its attentions 88 and 25 us ones.
    assert "| `attention` | 2, 16, 0.0 | 2, 56, 0.1 |" in table
    assert "| `copy` | - | 1, 25, 0.0 |" in table


def launched(name: str, ts: float, dur: float, correlation: int) -> dict:
    return dict(kernel(name, ts, dur), args={"correlation": correlation})


def host_call(name: str, correlation: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": 0, "dur": 1,
            "args": {"correlation": correlation}}


def graph(correlation: int, start: float, kernels: int, each: float = 10.0) -> list:
    return [host_call("cudaGraphLaunch", correlation)] + [
        launched("layer", start + i * each, each, correlation) for i in range(kernels)]


def test_decode_steps_pair_consecutive_replays_of_the_decode_graph_and_sum_what_lies_between(tmp_path):
    # Three 4-kernel decode graphs 100 us apart (40 us each), the first two with two eager
    # kernels between them (one launched by cudaLaunchKernel, one by the driver), then a
    # 2-kernel graph (a prefill piece) that breaks the third pair, then a fourth decode graph.
    events = (graph(1, 0, 4) + graph(2, 100, 4) + graph(3, 200, 4) + graph(4, 250, 2)
              + graph(5, 300, 4)
              + [host_call("cudaLaunchKernel", 10), launched("index", 50, 5, 10),
                 launched("index", 60, 10, 10),
                 {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "ts": 0, "dur": 1,
                  "args": {"correlation": 11}}, launched("triton", 150, 20, 11)])
    steps = kernel_profile.decode_steps(events, min_graph_kernels=3)
    assert steps.graph_kernels == 4
    assert steps.steps == 2  # 1->2 and 2->3; 3->4 and 4->5 are broken by the 2-kernel graph
    assert steps.period_us == 100.0 and steps.graph_span_us == 40.0
    assert steps.between_busy_us == (15.0 + 20.0) / 2 and steps.between_kernels == 1.5
    assert steps.between_idle_us == 60.0 - 17.5
    assert steps.between_by_name_us == {"index": 7.5, "triton": 10.0}
    # A kernel whose host call is not a graph launch never counts as a graph, however many.
    eager = [host_call("cudaLaunchKernel", 7)] + [launched("layer", 400 + i, 1, 7) for i in range(9)]
    assert kernel_profile.decode_steps(events + eager, min_graph_kernels=3).graph_kernels == 4
    assert kernel_profile.decode_steps(events, min_graph_kernels=5).steps == 0
    # dynamic's triton kernel starts 40 us later, its last 10 us inside the next graph: clipped
    paths = traces_shifting(tmp_path, events, "triton", {"plain": 0, "dynamic": 40})
    with pytest.raises(SystemExit):
        kernel_profile.main(["--decode-steps"])
    assert "| consecutive steps | 0 | 0 |" in kernel_profile.main(["--decode-steps", *(
        f"{c}={p}" for c, p in paths.items())])  # the command line's floor is 100 kernels
    table = kernel_profile.decode_steps_markdown(paths, min_graph_kernels=3)
    assert "| period (us) | 100 | 100 |" in table
    assert "| GPU busy between graphs (us) | 18 | 12 |" in table  # (15 + 20) / 2 against (15 + 10) / 2
    assert "| GPU idle between graphs (us) | 42 | 48 |" in table
