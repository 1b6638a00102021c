"""The project's release: its version's image, chart, SBOM, changelog and checksums, built by `./dev release`."""
