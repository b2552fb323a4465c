"""Host side of `labctl sandbox`: a Docker Engine client over its unix socket (`docker`), the
warm pool (`pool`), running programs (`runner`). Stdlib only; runs on the host's Python 3.8+.
"""
