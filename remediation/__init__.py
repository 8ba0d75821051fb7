"""remediation"""
