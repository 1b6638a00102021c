"""The test suite: unit tests mirror the packages; sim/ holds the simulated cluster."""
