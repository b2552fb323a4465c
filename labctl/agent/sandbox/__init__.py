"""Host side of `labctl sandbox`: the Docker containers that run untrusted programs."""
