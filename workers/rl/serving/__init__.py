"""OpenAI-compatible servers: the studio's own, the vLLM launcher, and the weight sync they share."""
