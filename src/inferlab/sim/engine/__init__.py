"""The simulated engine: a vLLM-V1-like scheduler and paged KV cache with prefix caching
(pure bookkeeping), a roofline step-time model, GPU and model presets, and the engine
families (vLLM V1/V0, SGLang, TensorRT-LLM, LMDeploy) it can be set up as. Clock-free:
the caller owns time.
"""
