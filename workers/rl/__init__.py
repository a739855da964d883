"""The learning half: a tiny causal LM the project trains itself, sampling with logprobs, and the GRPO update.
No Django here. (The scheduler, agent loop, pipeline and other inference engines come with issue 5.)"""
