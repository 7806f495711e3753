"""Cutting a byte stream the way a network may deliver it."""

from __future__ import annotations

import random


def random_splits(data: bytes, rng: random.Random, cuts: int = 4) -> list[bytes]:
    """``data`` in ``cuts + 1`` pieces (fewer if it is shorter), cut at random places."""
    points = sorted(rng.sample(range(1, len(data)), min(cuts, len(data) - 1)))
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
