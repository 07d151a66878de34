"""The feedback store: delayed ground truth joined to logged predictions (SQLite or PostgreSQL)."""
