"""ingest/collectors"""
