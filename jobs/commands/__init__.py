"""jobs/commands"""
