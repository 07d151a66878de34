"""The HTTP API: routes, protocol schemas and their encoders, auth, admission, middleware."""
