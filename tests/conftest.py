"""What every test shares: the run history goes to a temporary file, never to the
user's data directory (subprocesses inherit the variable); a tiny byte-level BPE
trained here on Python's own standard library (offline, about a second), for the tests
that need a tokenizer (the workload's, and those of a server's own chat template):
nothing is downloaded."""

from __future__ import annotations

import glob
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _history_for_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The history of every fixture of a wider scope (a module's profile or sweep runs
    before any test's own fixture): set for the whole session, so that nothing reaches
    the user's own file (it did, from module-scoped fixtures)."""
    path = tmp_path_factory.mktemp("history-session") / "history.sqlite"
    before = os.environ.get("INFERLAB_HISTORY")
    os.environ["INFERLAB_HISTORY"] = str(path)
    yield path
    if before is None:
        os.environ.pop("INFERLAB_HISTORY", None)
    else:
        os.environ["INFERLAB_HISTORY"] = before


@pytest.fixture(autouse=True)
def _history_in_tmp(_history_for_the_session: Path, tmp_path_factory: pytest.TempPathFactory,
                    monkeypatch: pytest.MonkeyPatch) -> Path:
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
