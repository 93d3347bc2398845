"""tools/decode_rates.py: sglang's decode log lines read per server and batch size (a diagnostic
over logs; no speed is asserted of any server)."""

from __future__ import annotations

import lzma
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import decode_rates  # noqa: E402


def line(running: int, rate: float, queued: int = 0) -> str:
    return (f"[2026-12-06 03:07:04] Decode batch, #running-req: {running}, #token: 22416, token usage: 0.19, "
            f"accept len: 3.00, accept rate: 0.67, cuda graph: True, gen throughput (token/s): {rate:.2f}, "
            f"#queue-req: {queued}")


PREFILL = "[2026-12-06 03:07:05] Prefill batch, #new-seq: 1, #new-token: 512, #running-req: 31, #queue-req: 0"

LOG = "\n".join([
    "===== eagle3: last lines of the server log =====",
    line(32, 5000),  # the section's first decode line: its interval starts before the log
    line(32, 8000), line(32, 7900),
    PREFILL, line(32, 300),  # its interval held a prefill
    line(32, 100, queued=5),  # a queue: prefills interleave, left out
    line(32, 7950),
    line(4, 1400).replace("Decode batch,", "Decode batch [812],"),  # SGLANG_LOG_FORWARD_ITERS=1
    PREFILL,
    "===== dynamic: last lines of the server log =====",
    line(32, 6000), line(32, 7400), line(32, 7420), line(32, 7380),
])


def test_rates_are_kept_per_server_and_batch_size_from_intervals_without_a_prefill():
    rates = decode_rates.decode_rates(LOG)
    assert rates == {"eagle3": {32: [8000.0, 7900.0, 7950.0], 4: [1400.0]},
                     "dynamic": {32: [7400.0, 7420.0, 7380.0]}}
    assert decode_rates.decode_rates(LOG, with_prefill=True) == {"eagle3": {32: [300.0]}}


def test_the_table_gives_medians_and_leaves_thin_cells_out():
    rows = decode_rates.table(decode_rates.decode_rates(LOG), min_lines=3)
    assert rows[0] == "| running requests | eagle3 (lines) | dynamic (lines) |"
    assert rows[2:] == ["| 32 | 7950 (3) | 7400 (3) |"]  # batch 4 has one line: below --min-lines
    assert decode_rates.table(decode_rates.decode_rates(LOG), min_lines=1)[2] == "| 4 | 1400 (1) | - |"


def test_the_command_reads_compressed_logs_and_refuses_bad_input(tmp_path, capsys):
    path = tmp_path / "server_logs_tail.txt.xz"
    with lzma.open(path, "wt") as f:
        f.write(LOG)
    assert decode_rates.main([str(path)]) == 0
    assert "| 32 | 7950 (3) | 7400 (3) |" in capsys.readouterr().out
    assert decode_rates.main([str(path), "--with-prefill", "--min-lines", "1"]) == 0
    assert "| 32 | 300 (1) |\n" in capsys.readouterr().out  # only eagle3 had one
    plain_log = tmp_path / "server_plain.log"
    plain_log.write_text("\n".join(line(8, rate) for rate in (900, 1500, 1550, 1525)))
    assert decode_rates.main([str(plain_log)]) == 0
    assert "| 8 | 1525 (3) |" in capsys.readouterr().out
    # Two benchmark folders: the same server names stay apart, named with their folders.
    for folder in ("run-a", "run-b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "server_logs_tail.txt").write_text(LOG)
    assert decode_rates.main([str(tmp_path / "run-a/server_logs_tail.txt"),
                              str(tmp_path / "run-b/server_logs_tail.txt")]) == 0
    out = capsys.readouterr().out
    assert "run-a/eagle3 (lines) | run-a/dynamic (lines) | run-b/eagle3 (lines) | run-b/dynamic (lines)" in out
    empty = tmp_path / "empty.log"
    empty.write_text("nothing decoded\n")
    assert decode_rates.main([str(empty)]) == 1
    with pytest.raises(SystemExit):
        decode_rates.main([str(tmp_path / "missing.log")])
    with pytest.raises(SystemExit):
        decode_rates.main([str(path), "--min-lines", "0"])
