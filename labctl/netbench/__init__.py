"""`labctl bench network`: TCP throughput host to host, as a share of the link from facts."""
