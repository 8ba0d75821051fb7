"""Named, parameterised SQL over the lake tables (one query per .sql file)."""
