"""When requests are sent: the schedules (closed loop, open loop, replay), the one load
policy that decides what is sent when, its two executors (asyncio + HTTP, and virtual
time over the simulated engine), and ``run``, the library call behind ``bench`` and
``sim run``.
"""
