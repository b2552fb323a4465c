"""Model code the agent's features share: tinylm, the small transformer labctl writes (modelload),
trains (train) and serves (orchestra). It imports torch, so only commands that need a model load it."""
