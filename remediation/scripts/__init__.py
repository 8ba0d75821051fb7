"""Curated remediation scripts, one module per allowlisted id (see remediation.registry)."""
