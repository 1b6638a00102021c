"""What serves the admission rules: the Flask view, the gunicorn worker and its connections, start-up, metrics."""
