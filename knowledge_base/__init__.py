"""knowledge_base"""
