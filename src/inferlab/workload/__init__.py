"""What is sent, with nothing about timing: request specs, token lengths, prompts built
to exact lengths, tokenizers, datasets, multi-turn sessions, traces, and the
``WorkloadConfig`` that builds one of them from flags.
"""
