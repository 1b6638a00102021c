"""The admission rules, pure: reviews in and out, the patch, the verdicts; nothing of HTTP or of webhook.server."""
