"""A tiny byte-level BPE trained here on Python's own standard library (offline, about a
second), shared by the tokenizer tests: nothing is downloaded."""

from __future__ import annotations

import glob
import os
import sysconfig

import pytest


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
