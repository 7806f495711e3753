"""The simulated inference engine: vLLM-V1-like scheduling on a roofline step-time model."""

from inferlab.sim._engine import (
    Engine,
    EngineConfig,
    RequestTimeline,
    StepResult,
    StepStats,
    TokenEvent,
)
from inferlab.sim._steptime import Efficiencies, RooflineStepTime, StepTimeModel
from inferlab.sim._virtual import run_virtual

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
    "run_virtual",
]
