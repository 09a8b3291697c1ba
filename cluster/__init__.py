"""Cluster-level pieces: CLI, config, built-in model maker."""
