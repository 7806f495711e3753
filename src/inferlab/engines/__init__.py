"""Real inference engines on this machine, for tests and side-by-side checks.

``llamacpp`` builds llama.cpp's ``llama-server`` from source (the ``llama-cpp-python``
sdist on PyPI) and starts it; ``tinymodel`` generates a tiny Llama-architecture model
offline (random weights, a locally trained tokenizer) for it to serve. Both cache what
they make per machine (``cache``), so a machine builds and generates once. Nothing here
is imported by the rest of inferlab: it needs the ``engines`` extra (``gguf``,
``numpy``, ``tokenizers``) and a C++ tool chain, which the core install does not.
"""
