"""ShareGPT V3 token lengths as vLLM's benchmark sampler picks them (shipped data).

The first 1,280 requests of a published ``benchmark_serving`` run (see the JSON's
``source``): prompt tokens, and the tokens the model generated (0: no text). They stand
for "ShareGPT" wherever a workload or a published row names the dataset without its
lengths: the shape (many short turns, a bounded tail) decides how long a batch runs.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources


@cache
def sharegpt_lengths() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(input_lens, output_lens)``, paired by index."""
    text = resources.files("inferlab").joinpath("data/sharegpt_lengths.json").read_text()
    data = json.loads(text)
    return tuple(data["input_lens"]), tuple(data["output_lens"])
