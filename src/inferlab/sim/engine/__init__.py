"""The simulated engine: a vLLM-V1-like scheduler and paged KV cache with prefix caching
(pure bookkeeping), a roofline step-time model, GPU and model presets, and the engine
families (vLLM V1/V0, SGLang, TensorRT-LLM, LMDeploy) it can be set up as. Clock-free:
the caller owns time.

An engine is built in order: ``config`` (vLLM's flags; ``resolve`` reads their names and
sets the switches the flags leave open from ``families``, the one table of what each
engine family changes) → ``sizing`` (weights, activations, KV blocks, scheduler sizes,
API costs) → ``kvcache`` + ``scheduler`` → ``engine`` (the step loop), which prices each
step with ``steptime``. ``dtypes`` holds the quantization and dtype enums with their
alias tables, ``hardware`` the model and GPU presets.
"""
