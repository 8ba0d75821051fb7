"""Shared fixtures: real server processes live in tests/servers.py."""

pytest_plugins = ["tests.servers"]
