"""Tests of what serves the rules (webhook.server): the view, the worker and its connections, start-up, metrics."""
