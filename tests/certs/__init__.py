"""Tests of the certificate and signing-key tooling."""
