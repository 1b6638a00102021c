"""Tests of the pure admission rules (webhook.rules), as tables over plain pods and reviews."""
