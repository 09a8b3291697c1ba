"""The SLA planner: sizes each model's prefill and decode pools from Prometheus and a profile."""
