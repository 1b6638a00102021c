"""Tests of the admission side and the shared annotation contract."""
