"""The recall variant of the tiny-pair corpus (``--set repeat_chunk=N``): documents whose chunks
come twice, and the target's copy accuracy that the training card reports for it."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from tiny_pair_training.corpus import repeated_chunks  # noqa: E402
from tiny_pair_training.evaluation import copy_accuracy  # noqa: E402


def test_each_chunk_comes_twice_between_the_documents_markers() -> None:
    assert repeated_chunks([1, 10, 11, 12, 13, 14, 2], 2) == [1, 10, 11, 10, 11, 12, 13, 12, 13, 14, 14, 2]


class CopyingTarget:
    """Predicts the token ``chunk`` positions back (what a target that learnt to copy does at
    second copies), and token 0 where there is none."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk

    def __call__(self, input_ids: torch.Tensor) -> SimpleNamespace:
        ids = input_ids[0]
        guesses = [int(ids[i + 1 - self.chunk]) if i + 1 - self.chunk >= 1 else 0 for i in range(len(ids))]
        logits = torch.nn.functional.one_hot(torch.tensor(guesses), 64).float()[None]
        return SimpleNamespace(logits=logits)


def test_copy_accuracy_separates_first_and_second_copies() -> None:
    chunk = 4
    doc = repeated_chunks([1, *range(3, 3 + 16), 2], chunk)
    accuracy = copy_accuracy(CopyingTarget(chunk), [doc], chunk, max_docs=1, max_positions=len(doc),
                             device=torch.device("cpu"))
    assert accuracy == {"first": 0.0, "second": 1.0}
