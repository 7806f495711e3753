"""What every test shares: the run history goes to a temporary file, never to the
user's data directory (subprocesses inherit the variable); a tiny byte-level BPE
trained here on Python's own standard library (offline, about a second), for the tests
that need a tokenizer (the workload's, and those of a server's own chat template):
nothing is downloaded."""

from __future__ import annotations

import glob
import os
import sysconfig
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _history_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path_factory.mktemp("history") / "history.sqlite"
    monkeypatch.setenv("INFERLAB_HISTORY", str(path))
    return path


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ``tokenizer.json`` (vocabulary 6,000, ChatML's special tokens), alone in its folder."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=6000,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False,
    )
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:60]
    tok.train(files, trainer)
    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(out))
    return str(out)
