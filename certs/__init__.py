"""Certificate authority, serving certificate and intent-signing key tooling."""
