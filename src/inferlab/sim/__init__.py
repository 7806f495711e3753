"""The simulated inference engine (``sim.engine``), its HTTP server (``sim.server``) and
its validation against published measurements (``sim.validation``)."""

from inferlab.sim.engine.engine import (
    Engine,
    EngineConfig,
    RequestTimeline,
    StepResult,
    StepStats,
    TokenEvent,
)
from inferlab.sim.engine.steptime import Efficiencies, RooflineStepTime, StepTimeModel

__all__ = [
    "Efficiencies",
    "Engine",
    "EngineConfig",
    "RequestTimeline",
    "RooflineStepTime",
    "StepResult",
    "StepStats",
    "StepTimeModel",
    "TokenEvent",
]
