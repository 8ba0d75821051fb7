"""Shared fixtures: real server processes live in tests/servers.py, a real tmpfs in tests/fs.py."""

pytest_plugins = ["tests.servers", "tests.fs"]
