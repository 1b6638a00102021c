"""What both node programs stand on: the GPUs, CDI files, the API-server client, deadlines and process lifecycle."""
