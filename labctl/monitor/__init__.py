"""Monitoring: host status samples, alerts, and the Prometheus metrics made from them."""
