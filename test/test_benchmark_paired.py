"""The paired benchmark (benchmark/paired.py): prompts, order, pair statistics, and one wave of
sglang's own streamed requests against a stand-in server."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

import paired  # noqa: E402


def wave(config: str, ttfts, tokens: int = 100, wall_s: float = 1.0, failed: int = 0) -> paired.Wave:
    return paired.Wave(config, tuple(ttfts), tokens, wall_s, failed)


def test_both_configurations_get_the_same_fresh_prompts_and_the_order_flips() -> None:
    first = paired.wave_prompts(1, 4, 0, 4, 16)
    assert first == paired.wave_prompts(1, 4, 0, 4, 16)
    assert first != paired.wave_prompts(1, 4, 1, 4, 16)
    assert len(first) == 4 and all(len(prompt) == 16 for prompt in first)
    assert all(3 <= token < 8000 for prompt in first for token in prompt)
    assert paired.pair_order(("a", "b"), 0) == ["a", "b"]
    assert paired.pair_order(("a", "b"), 1) == ["b", "a"]


def test_ratios_are_taken_pair_by_pair_so_a_slow_stretch_moves_both_sides() -> None:
    """Pair 2 ran in a slow stretch: both servers 1.6x slower. Pairwise, b stays 0.9x of a;
    a ratio of the two servers' overall medians would not see it as clearly."""
    pairs = [
        {"a": wave("a", [40.0]), "b": wave("b", [36.0], tokens=110)},
        {"a": wave("a", [40.0]), "b": wave("b", [36.0], tokens=110)},
        {"a": wave("a", [64.0]), "b": wave("b", [57.6], tokens=110)},
        {"a": wave("a", [40.0]), "b": wave("b", [10.0], failed=1)},  # left out: a request failed
    ]
    summary = paired.pair_summary(pairs, "a", "b")
    assert summary["pairs"] == 3
    assert summary["median_ttft_ratio_quartiles"] == pytest.approx((0.9, 0.9, 0.9))
    assert summary["throughput_ratio_quartiles"] == pytest.approx((1.1, 1.1, 1.1))
    assert summary["pairs_other_ttft_lower"] == 3
    assert summary["median_ttft_ms"] == {"a": 40.0, "b": 36.0}


def test_the_report_names_the_ratio_and_its_quartiles() -> None:
    document = {"sources": [{"command_line": "paired.py", "created": "now", "gpu": "none"}],
                "summary": [{"concurrency": 1, "summary": paired.pair_summary(
                    [{"a": wave("a", [40.0 + i]), "b": wave("b", [38.0 + i])} for i in range(5)], "a", "b")},
                            {"concurrency": 4, "summary": {"pairs": 0}}]}
    text = paired.report_markdown(document, "a", "b")
    assert ("| 1 | 5 | 0.951 / 0.952 / 0.954 | 0.952 [0.951, 0.954] | 1.000 / 1.000 / 1.000 | "
            "1.000 [1.000, 1.000] | 5 | 42.0 / 40.0 |") in text
    assert "| 4 | 0 |" + " n/a |" * 7 in text


def test_the_interval_excludes_one_only_where_the_pairs_show_a_difference() -> None:
    """Ratios scattered 0.8-1.25 around 1 give an interval across 1; the same scatter around
    0.9 gives one below 1; one ratio gives a point."""
    around_one = [0.8, 1.25] * 30
    low, centre, high = paired.geometric_mean_interval(around_one)
    assert low < 1.0 < high and centre == pytest.approx(1.0)
    low, centre, high = paired.geometric_mean_interval([0.9 * ratio for ratio in around_one])
    assert high < 1.0 and centre == pytest.approx(0.9)
    assert paired.geometric_mean_interval([1.1]) == pytest.approx((1.1, 1.1, 1.1))


def test_a_saved_run_is_summarised_again_without_servers(tmp_path: Path, capsys) -> None:
    measured = [{"concurrency": 1, "pair": i, "waves": {
        "eagle3": {"config": "eagle3", "ttfts_ms": [40.0], "output_tokens": 100, "wall_s": 1.0, "failed": 0},
        "dynamic": {"config": "dynamic", "ttfts_ms": [36.0], "output_tokens": 100, "wall_s": 1.0, "failed": 0}}}
        for i in range(3)]
    document = paired.results.new_results_document(["paired.py"], {"configs": "eagle3,dynamic", "concurrencies": [1]})
    document["pairs"] = measured
    paired.results.save_results(document, tmp_path / paired.RESULTS_FILE)
    assert paired.main(["--report-from", str(tmp_path)]) == 0
    saved = paired.results.load_results(tmp_path / paired.RESULTS_FILE)
    assert saved["summary"][0]["summary"]["ttft_ratio_geometric_mean_ci95"] == pytest.approx((0.9, 0.9, 0.9))
    assert "| 1 | 3 | 0.900 / 0.900 / 0.900 | 0.900 [0.900, 0.900] |" in (tmp_path / paired.REPORT_FILE).read_text()


async def stand_in_generate(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    stream = web.StreamResponse()
    await stream.prepare(request)
    for count in range(1, body["sampling_params"]["max_new_tokens"] + 1):
        chunk = {"text": "x" * count, "meta_info": {"completion_tokens": count}}
        await stream.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await stream.write(b"data: [DONE]\n\n")
    return stream


def test_a_wave_of_sglangs_own_requests_against_a_stand_in_server() -> None:
    async def scenario() -> paired.Wave:
        app = web.Application()
        app.router.add_post("/generate", stand_in_generate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            return await paired.run_wave("a", f"http://127.0.0.1:{port}", paired.wave_prompts(1, 3, 0, 3, 8),
                                         5, paired.sglang_request(visible_special_tokens=True))
        finally:
            await runner.cleanup()

    result = asyncio.run(scenario())
    assert result.failed == 0 and len(result.ttfts_ms) == 3
    assert result.output_tokens == 15
    assert all(ttft > 0 for ttft in result.ttfts_ms)


def test_measure_alternates_the_order_and_records_only_the_pairs_after_the_warm_up() -> None:
    calls: list[str] = []
    warmed: list[int] = []

    async def request(url: str, prompt: list[int], output_len: int) -> paired.WaveRequest:
        calls.append(url)
        return paired.WaveRequest(True, 30.0 if url == "A" else 27.0, output_len)

    args = paired.build_parser().parse_args(
        ["--model-path", "m", "--out", "o", "--concurrencies", "2,1", "--pairs", "3", "--warmup-pairs", "1",
         "--input-len", "4", "--output-len", "5"])
    measured = asyncio.run(paired.measure(args, ("eagle3", "dynamic"), {"eagle3": "A", "dynamic": "B"}, request,
                                          lambda: warmed.append(len(calls))))
    assert [(item["concurrency"], item["pair"]) for item in measured] == [(2, 0), (2, 1), (2, 2), (1, 0), (1, 1), (1, 2)]
    assert warmed == [4, 18]  # after each concurrency's warm-up pair: 4 + 3 x 4 + 2 calls
    assert calls[:8] == ["A", "A", "B", "B", "B", "B", "A", "A"]  # wave of 2, order flipping each pair
    rows = paired.summarise(measured, [2, 1], "eagle3", "dynamic")
    assert [row["summary"]["median_ttft_ratio_quartiles"][1] for row in rows] == pytest.approx([0.9, 0.9])
    assert rows[0]["summary"]["median_ttft_ms"] == {"eagle3": 30.0, "dynamic": 27.0}


def test_the_servers_are_interleaved_pys_with_a_kv_cap_for_the_largest_wave() -> None:
    args = paired.build_parser().parse_args(
        ["--model-path", "m", "--draft-model-path", "d", "--out", "o", "--concurrencies", "4,1"])
    args.adaptive_config_path = None
    workloads = [paired.interleaved.Workload(args.input_len, args.output_len, tuple(args.concurrencies), 1, 1)]
    commands = paired.interleaved.server_commands(args, ("eagle3", "dynamic"), workloads)
    assert [(name, port) for name, port, _ in commands] == [("eagle3", 30000), ("dynamic", 30001)]
    assert "EAGLE3_DYNAMIC" in commands[1][2]
    cap = commands[0][2][commands[0][2].index("--max-total-tokens") + 1]
    assert int(cap) == 4 * (512 + 64) * 5 // 4
