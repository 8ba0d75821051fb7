"""Scenario files shipped with the simulator (a package so that wheels carry the TOML files)."""
