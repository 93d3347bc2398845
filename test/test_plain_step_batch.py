"""CPU tests of the plain step's batch rewrite and of the plain-graph batch sizes."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import List, Optional

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_dynamic_eagle.engine.plain_decode_graphs import plain_decode_batch_sizes
from sglang_dynamic_eagle.engine.plain_step import turn_into_decode_batch as _turn_into_decode_batch


@dataclass
class FakeBatch:
    seq_lens: torch.Tensor
    req_pool_indices: torch.Tensor
    spec_info: SimpleNamespace
    reqs: List[object]
    seq_lens_cpu: Optional[torch.Tensor] = None
    seq_lens_sum: Optional[int] = None
    input_ids: Optional[torch.Tensor] = None
    out_cache_loc: Optional[torch.Tensor] = None
    forward_mode: ForwardMode = ForwardMode.DECODE


def req_to_token_table() -> torch.Tensor:
    """Slot of (request row r, position p) is 1000 * r + p."""
    rows = torch.arange(4, dtype=torch.int32).unsqueeze(1) * 1000
    return rows + torch.arange(64, dtype=torch.int32).unsqueeze(0)


def spec_v2_batch(with_cpu_lengths: bool) -> FakeBatch:
    return FakeBatch(
        seq_lens=torch.tensor([10, 37], dtype=torch.int64),
        req_pool_indices=torch.tensor([2, 0], dtype=torch.int64),
        spec_info=SimpleNamespace(bonus_tokens=torch.tensor([501, 702], dtype=torch.int32)),
        reqs=[object(), object()],
        seq_lens_cpu=torch.tensor([10, 37]) if with_cpu_lengths else None,
        seq_lens_sum=47 if with_cpu_lengths else None,
    )


def test_decode_batch_feeds_the_bonus_token_at_the_committed_length():
    batch = spec_v2_batch(with_cpu_lengths=True)
    _turn_into_decode_batch(batch, req_to_token_table())
    assert batch.input_ids.tolist() == [501, 702]
    assert batch.input_ids.dtype == torch.int64
    # Slots of position 10 for request row 2 and position 37 for row 0.
    assert batch.out_cache_loc.tolist() == [2010, 37]
    assert batch.out_cache_loc.dtype == torch.int64
    # DECODE convention: seq_lens include the token being decoded.
    assert batch.seq_lens.tolist() == [11, 38]
    assert batch.seq_lens_cpu.tolist() == [11, 38]
    assert batch.seq_lens_sum == 49
    assert batch.forward_mode == ForwardMode.DECODE
    assert batch.spec_info is None


def test_decode_batch_without_cpu_lengths_keeps_them_unset():
    batch = spec_v2_batch(with_cpu_lengths=False)
    _turn_into_decode_batch(batch, req_to_token_table())
    assert batch.seq_lens_cpu is None
    assert batch.seq_lens_sum is None
    assert batch.seq_lens.tolist() == [11, 38]


def test_plain_graph_sizes_are_those_of_a_server_without_speculation():
    decode = SimpleNamespace(bs=[1, 2, 3, 4, 5, 6, 7, 8, 10, 12], max_bs=64)
    server_args = SimpleNamespace(
        cuda_graph_config=SimpleNamespace(decode=decode), disable_cuda_graph_padding=False
    )
    assert plain_decode_batch_sizes(server_args) == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]


def test_plain_graph_sizes_without_padding_cover_every_batch():
    decode = SimpleNamespace(bs=[1, 2, 3], max_bs=5)
    server_args = SimpleNamespace(
        cuda_graph_config=SimpleNamespace(decode=decode), disable_cuda_graph_padding=True
    )
    assert plain_decode_batch_sizes(server_args) == [1, 2, 3, 4, 5]


class FakeRunner:
    """Mimics the target model runner's sampling pieces, recording their order."""

    def __init__(self) -> None:
        self.calls: List[str] = []
        self.ngram_embedding_manager = SimpleNamespace(
            update_after_decode=lambda **kwargs: self.calls.append("ngram")
        )

    def _preprocess_logits(self, logits_output, sampling_info) -> None:
        self.calls.append("preprocess")
        logits_output.next_token_logits[:, 0] += 5.0  # a logit bias on token 0

    def sampler(self, logits_output, sampling_info, return_logprob, top_logprobs_nums,
                token_ids_logprobs, positions) -> torch.Tensor:
        self.calls.append("sample")
        assert return_logprob is False
        logits_output.next_token_logits.div_(2.0)  # in-place temperature, as sglang's sampler
        return torch.argmax(logits_output.next_token_logits, dim=-1)


def test_plain_sampling_reports_logprobs_of_the_adjusted_logits():
    from sglang_dynamic_eagle.engine.plain_step import PlainDecodeStep

    step = object.__new__(PlainDecodeStep)
    runner = FakeRunner()
    step._target_worker = SimpleNamespace(model_runner=runner)
    step._row_index = torch.arange(8)
    logits = torch.tensor([[1.0, 2.0, 0.0], [0.0, 9.0, 1.0]])
    logits_output = SimpleNamespace(next_token_logits=logits.clone())
    batch = SimpleNamespace(
        return_logprob=True,
        seq_lens=torch.tensor([5, 6]),
        sampling_info=SimpleNamespace(is_all_greedy=True),
        top_logprobs_nums=None,
        token_ids_logprobs=None,
    )
    forward_batch = SimpleNamespace(sampling_info=batch.sampling_info, positions=torch.tensor([5, 6]))

    next_ids = step._sample(batch, forward_batch, logits_output)

    assert runner.calls == ["preprocess", "sample", "ngram"]
    assert next_ids.tolist() == [0, 1]  # token 0 wins row 0 only because of the bias
    adjusted = logits.clone()
    adjusted[:, 0] += 5.0
    expected = torch.log_softmax(adjusted, dim=-1)[torch.arange(2), next_ids]
    assert torch.allclose(logits_output.next_token_logprobs.reshape(-1), expected)
    assert logits_output.next_token_logprobs.shape == (2, 1)
