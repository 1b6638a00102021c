"""The simulated cluster: a test API server with a real admission chain, and the actors built on it."""
