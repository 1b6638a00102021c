"""Helpers shared by several test packages (a real webhook server, ...)."""
