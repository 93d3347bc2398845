"""The training corpus: the standard library's .py files, with a deterministic held-out split."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import sysconfig
from pathlib import Path

from tiny_pair_training.scale import HELDOUT_MODULO

logger = logging.getLogger("train_tiny_pair")


@dataclasses.dataclass
class Corpus:
    train: list[tuple[str, str]]  # (relative path, text)
    heldout: list[tuple[str, str]]


def repeated_chunks(doc: list[int], chunk: int) -> list[int]:
    """<s> c1 c1 c2 c2 ... </s> for a document <s> c1 c2 ... </s>: the second copy of each chunk
    is predictable only by reading the first, ``chunk`` positions back."""
    body = doc[1:-1]
    out = doc[:1]
    for start in range(0, len(body), chunk):
        piece = body[start : start + chunk]
        out += piece + piece
    return out + doc[-1:]


def is_heldout(rel_path: str) -> bool:
    return int(hashlib.sha1(rel_path.encode()).hexdigest(), 16) % HELDOUT_MODULO == 0


def load_corpus(max_train_chars: int | None) -> Corpus:
    """The standard library's .py files, split deterministically by a hash of their path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py")
        if not {"site-packages", "dist-packages", "__pycache__"} & set(p.parts)
    )
    # A hash order keeps a --smoke subset spread over the whole library.
    files.sort(key=lambda p: hashlib.sha1(str(p.relative_to(root)).encode()).hexdigest())
    corpus = Corpus(train=[], heldout=[])
    train_chars = 0
    for path in files:
        rel = str(path.relative_to(root))
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            continue
        if is_heldout(rel):
            corpus.heldout.append((rel, text))
        elif max_train_chars is None or train_chars < max_train_chars:
            corpus.train.append((rel, text))
            train_chars += len(text)
    if max_train_chars is not None:
        corpus.heldout = corpus.heldout[: max(4, len(corpus.train) // HELDOUT_MODULO)]
    logger.info("corpus %s: %d train files (%.1f MB), %d held-out files", root,
                len(corpus.train), train_chars / 1e6, len(corpus.heldout))
    return corpus
